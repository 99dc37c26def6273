"""Log-prob parity between the engine and the trainer: measured at a stage's first step, a gap stops it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from aclarena_slime import parity
from aclarena_slime.local import stage as stage_module
from aclarena_slime.local.group_filter import FILTER_PATHS
from aclarena_slime.local.parity_probe import PROMPTS, SAMPLES, TOKENS, probe_session
from aclarena_slime.local.trainer import PolicyTrainer
from aclarena_slime.plugin import registry
from aclarena_slime.testing.local import LEARNABLE, local_session

STAGE = (*LEARNABLE, "rollout.num_rollout=1", "rollout.rollout_batch_size=2", "rollout.n_samples_per_prompt=2",
         "rollout.rollout_max_response_len=8", "++cluster.local.eval_size=1", "++cluster.local.torch_threads=1",
         "++cluster.local.progress=false")  # fmt: skip


@pytest.fixture(autouse=True)
def _learnable_registered():
    from aclarena_envs.learnable.env import LearnableEnvironment

    registry.register("learnable", LearnableEnvironment)


def test_compare_gates_on_the_mean_gap_of_loss_mask_tokens():
    report = parity.compare([[-1.0, -2.0, -9.0]], [[-1.0, -2.5, 0.0]], [[1, 1, 0]], tolerance=0.3)
    assert (report.tokens, report.mean_abs, report.max_abs) == (2, 0.25, 0.5) and report.ok
    assert "parity ok" in parity.require(report).line()
    with pytest.raises(parity.ParityError, match="no loss-mask tokens"):
        parity.require(parity.compare([[-1.0]], [[-1.0]], [[0]], tolerance=0.3))
    with pytest.raises(ValueError, match="sample 0"):
        parity.compare([[-1.0]], [[-1.0, -2.0]], [[1]], tolerance=0.3)


def test_a_stage_records_parity_at_its_first_step(tmp_path):
    metrics = stage_module.run_stage(local_session(tmp_path, *STAGE))
    first = metrics["steps"][0]
    assert first["parity_mean_abs"] <= parity.LOCAL_TOLERANCE and first["parity_max_abs"] >= first["parity_mean_abs"]


def test_a_mismatch_stops_the_stage_before_it_trains(tmp_path, monkeypatch):
    """Engine log-probs off by 0.5 nats (what a wrong adapter or temperature looks like): no update happens."""
    to_train = stage_module.to_train_sample

    def off_by_half(sample):
        out = to_train(sample)
        return dataclasses.replace(out, rollout_log_probs=[lp - 0.5 for lp in out.rollout_log_probs])

    steps: list[int] = []
    monkeypatch.setattr(stage_module, "to_train_sample", off_by_half)
    monkeypatch.setattr(PolicyTrainer, "step", lambda self, samples: steps.append(len(samples)) or {})
    with pytest.raises(parity.ParityError, match="parity FAILED.*mean \\|gap\\| 0.5"):
        stage_module.run_stage(local_session(tmp_path, *STAGE))
    assert steps == []


def test_the_doctor_runs_the_parity_check_for_a_local_recipe(tmp_path):
    from aclarena_slime.cli.doctor import local_parity_check
    from aclarena_slime.recipes.compose import load_recipe
    from aclarena_slime.recipes.schema import StageRecipe

    root = Path(__file__).resolve().parents[2] / "recipes"
    recipe: StageRecipe = load_recipe(root / "stage1_math.yaml", ["cluster=local", f"paths.root={tmp_path}"])
    check = local_parity_check(recipe)
    assert check.status == "ok" and "log-prob parity ok" in check.detail, check.line()
    assert not any((tmp_path / "runs").rglob("adapter_model.safetensors"))  # a probe leaves no stage outputs


@pytest.mark.parametrize(
    "changes",
    [(), ("rollout.over_sampling_batch_size=8", "rollout.rollout_batch_size=4"), ("rollout.over_sampling_batch_size=6",),
     ("++cluster.local.warm_start_steps=2", "++cluster.local.warm_start_demos=x.y"), ("data.eval_max_response_len=40",),
     (f"rollout.dynamic_sampling_filter_path={FILTER_PATHS[0]}", "rollout.num_rollout=3")],
)  # fmt: skip
def test_the_probe_shrinks_the_stages_session_as_it_would_the_stages_settings(tmp_path, changes):
    """run_probe takes the stage's session: its probe is the session the shrunk settings build, part for part (its
    outputs in the scratch folder)."""
    sizes = ("rollout.rollout_batch_size=6", "rollout.n_samples_per_prompt=3", "rollout.rollout_max_response_len=32")
    stage = (*STAGE, *sizes, *changes)
    scratch = tmp_path / "scratch"
    small = local_session(tmp_path, *stage, f"rollout.rollout_batch_size={PROMPTS}",
                          f"rollout.n_samples_per_prompt={SAMPLES}", f"rollout.rollout_max_response_len={TOKENS}",
                          "++cluster.local.warm_start_steps=0")  # fmt: skip
    small = dataclasses.replace(small, paths=dataclasses.replace(small.paths, output_dir=scratch),
                                settings={**small.settings, "output_dir": str(scratch)})  # fmt: skip
    assert probe_session(local_session(tmp_path, *stage), scratch) == small
