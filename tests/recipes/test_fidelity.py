"""The fidelity table: every paper run compiled, every difference from the authors explained, FIDELITY.md current."""

from __future__ import annotations

import copy

import pytest

from aclarena_slime.recipes import fidelity
from aclarena_slime.recipes.fidelity import FidelityError, agree, load_data, render, run_rows, table


@pytest.fixture(scope="module")
def data():
    return load_data()


@pytest.fixture(scope="module")
def rows(data):
    return table(data)


def test_every_difference_from_the_authors_has_a_reason(rows):
    unexplained = [f"{r.run}: {r.setting} ({r.key}) authors {r.authors!r}, ours {r.ours!r}" for r in rows
                   if r.status == "unexplained"]  # fmt: skip
    assert not unexplained, "\n".join(unexplained)


def test_fidelity_md_is_generated_from_the_data_and_the_recipes(data, rows):
    assert fidelity.TABLE.read_text(encoding="utf-8") == render(rows, data), (
        "recipes/FIDELITY.md is stale: python -m aclarena_slime.recipes.fidelity"
    )


def test_every_paper_run_is_in_the_table(data):
    runs = {spec["recipe"].removesuffix(".yaml") for spec in data["runs"].values()}
    paper = {"stage1_math", "stage2_search_sft", "stage2_search", "stage3_retail_sft", "stage3_retail", "stage4_if",
             "sdft_backbone", "mle_math", "mle_search", "mle_retail", "mle_if", "oracle_math", "oracle_search",
             "oracle_retail", "oracle_if", "mopd"}  # fmt: skip
    assert paper <= runs


def test_each_run_covers_the_settings_that_change_training(data):
    for run in data["runs"]:
        keys = {row["key"] for row in run_rows(data, run)}
        if data["runs"][run]["recipe"].startswith(("stage", "mle", "oracle", "mopd")) and "sft" not in run:
            assert {"--load", "--lr", "--rollout-batch-size", "--n-samples-per-prompt", "--use-tis",
                    "--rollout-max-response-len", "--tensor-model-parallel-size"} <= keys, run  # fmt: skip
        else:
            assert {"--load", "--lr", "--global-batch-size", "--loss-type"} & keys, run


def test_a_recipe_that_drifts_from_the_authors_fails_the_table(data):
    """Change the authors' learning rate of the math stage: the compiled 1e-6 no longer agrees, no reason given."""
    drifted = copy.deepcopy(data)
    row = next(r for r in drifted["runs"]["stage1_math"]["rows"] if r["key"] == "--lr")
    row["authors"] = 2.0e-6
    bad = [r for r in table({"runs": {"stage1_math": drifted["runs"]["stage1_math"]}}) if r.status == "unexplained"]
    assert [r.key for r in bad] == ["--lr"]


def test_an_equivalent_must_match_our_compiled_value(data):
    drifted = copy.deepcopy(data)
    row = next(r for r in drifted["runs"]["stage2_search"]["rows"] if r["key"] == "--custom-tis-function-path")
    row["equivalent"] = "somewhere.else"
    (checked,) = [r for r in table({"runs": {"stage2_search": drifted["runs"]["stage2_search"]}})
                  if r.key == "--custom-tis-function-path"]  # fmt: skip
    assert checked.status == "differs"  # a stated reason still stands, but the equivalence no longer holds


def test_values_compare_as_switches_numbers_or_text():
    assert agree(True, True) and agree(None, False) and agree(None, None) and not agree(None, True)
    assert agree("1.0e-6", 1e-6) and agree("1", 1.0) and not agree("0.7", 0.8)
    assert agree("grpo", "grpo") and not agree("gspo", "grpo") and not agree("16", None)


def test_bad_rows_are_named(data):
    broken = {"runs": {"x": {"recipe": "stage1_math.yaml", "rows": [{"setting": "lr", "key": "--lr", "authrs": 1}]}}}
    with pytest.raises(FidelityError, match="unknown fields"):
        run_rows(broken, "x")
