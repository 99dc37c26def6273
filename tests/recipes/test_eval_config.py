"""The emitted ``--eval-config`` YAML: only keys slime's EvalDatasetConfig knows; slime itself accepts it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from aclarena_slime.cli import main
from aclarena_slime.evaluation import parse_suite
from aclarena_slime.recipes.compiler import load_stage_suite
from aclarena_slime.recipes.eval_config import SLIME_DATASET_KEYS, slime_eval_config
from aclarena_slime.slime_edge import path as hook_path

PAPER = Path(__file__).resolve().parents[2] / "recipes" / "eval" / "paper.yaml"


def _suite():
    return parse_suite(
        {
            "datasets": {
                "aime": {"env": "math", "path": "aime.jsonl", "n_samples": 16, "max_response_len": 16384},
                "nq": {"env": "search", "path": "/abs/nq.jsonl", "limit": 500, "top_k": 20, "temperature": 0.7},
            }
        }
    )


def test_entries_route_through_our_functions_with_the_env_tag():
    config = slime_eval_config(_suite(), data_root="/data")
    aime, nq = config["eval"]["datasets"]
    assert aime["path"] == "/data/aime.jsonl" and nq["path"] == "/abs/nq.jsonl@[0:500]"
    assert aime["custom_generate_function_path"] == hook_path("generate") and aime["custom_rm_path"] == hook_path(
        "reward"
    )
    assert aime["metadata_overrides"] == {"env": "math"} and nq["metadata_overrides"] == {"env": "search"}
    assert (aime["n_samples_per_eval_prompt"], aime["max_response_len"], aime["temperature"]) == (16, 16384, 1.0)
    assert nq["top_k"] == 20 and "top_k" not in aime
    assert aime["apply_chat_template"] is False and aime["input_key"] == "prompt"
    for entry in (aime, nq):
        assert set(entry) <= SLIME_DATASET_KEYS


def test_cli_writes_loadable_yaml(tmp_path):
    out = tmp_path / "eval.yaml"
    services = [
        "--service",
        "retriever_url=http://127.0.0.1:8000/retrieve",
        "--service",
        "retail_data_dir=/d",
        "--service",
        "user_sim_url=http://127.0.0.1:30001/v1",
        "--service",
        "user_sim_model=sim",
    ]
    base = ["eval", "slime-config", str(PAPER), "-o", str(out), "--data-root", str(tmp_path)]
    assert main(base) == 2 and not out.exists(), "unset services are refused before anything is written"
    assert main(base + services) == 0
    data = yaml.safe_load(out.read_text())

    names = [d["name"] for d in data["eval"]["datasets"]]
    assert names == [d.name for d in load_stage_suite(PAPER).datasets]
    assert all(d["path"].startswith(str(tmp_path)) for d in data["eval"]["datasets"])


@pytest.mark.slime
def test_slime_builds_its_dataset_configs_from_ours(tmp_path):
    from slime.utils.eval_config import build_eval_dataset_configs, ensure_dataset_list

    config = slime_eval_config(_suite(), data_root=tmp_path)
    args = SimpleNamespace()  # every value is set by the entries themselves or left None
    datasets = build_eval_dataset_configs(args, ensure_dataset_list(config["eval"]["datasets"]), {})
    assert [d.name for d in datasets] == ["aime", "nq"]
    assert datasets[0].custom_generate_function_path == hook_path("generate")
    assert datasets[1].inject_metadata({"x": 1}) == {"x": 1, "env": "search"}
