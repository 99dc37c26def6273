"""The forgetting monitor inside a real local stage: the earlier domain is checked through the evaluation
runner against the stage's engine, with the adapter being trained; a real fall raises the alarm."""

from __future__ import annotations

import string
from typing import Any, ClassVar

import pytest

from aclarena_slime.local.session import LocalSession
from aclarena_slime.local.stage import run_stage
from aclarena_slime.plugin import registry
from aclarena_slime.testing.local import LEARNABLE, local_session


@pytest.fixture(autouse=True)
def _envs_registered():
    from aclarena_envs.learnable.env import LearnableEnvironment

    class NoDigits(LearnableEnvironment):
        """An 'earlier domain' that rewards every character but digits: learning digits forgets it."""

        tag: ClassVar[str] = "nodigits"

        def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
            allowed = "".join(c for c in string.printable if not c.isdigit() and not c.isspace())
            return [{**r, "label": allowed} for r in super().demo_records(n, seed)]

    registry.register("learnable", LearnableEnvironment)
    registry.register("nodigits", NoDigits)


def stage(tmp_path, lr: float, *monitor: str) -> LocalSession:
    """The settings of test_reward_rises_on_the_learnable_env (the digit share rises by > 30 points), and the
    monitor over the earlier domain; ``monitor``: its further settings (``action=stop``)."""
    return local_session(
        tmp_path, *LEARNABLE, "rollout.num_rollout=8", "rollout.rollout_batch_size=4", "rollout.n_samples_per_prompt=8",
        "rollout.rollout_max_response_len=8", "++cluster.local.eval_size=0", f"algorithm.lr={lr}",
        "++cluster.local.torch_threads=1", "++cluster.local.progress=false",
        "++algorithm.extra.calculate_per_token_loss=true", "lora.rank=8",
        "lora.target_modules=[q_proj,v_proj,o_proj,up_proj,down_proj,lm_head]", "++monitor.enabled=true",
        "++monitor.domains=[nodigits]", "++monitor.interval=2", "++monitor.demo_size=8", "++monitor.max_response_len=8",
        "++monitor.max_drop=10.0", *(f"++monitor.{item}" for item in monitor),
    )  # fmt: skip


@pytest.mark.slow
def test_the_alarm_fires_when_training_makes_an_earlier_domain_fall_and_stops_the_stage(tmp_path):
    session = stage(tmp_path, 5e-2, "action=stop")
    metrics = run_stage(session)
    report = metrics["monitor"]
    curve = report["curves"]["nodigits"]
    (alarm,) = report["alarms"]
    assert curve[0][0] == 0 and alarm["drop"] > 10.0 and alarm["baseline"] == curve[0][1], curve
    assert report["stopped"] and len(metrics["steps"]) == alarm["step"] < 8  # ended at the fall
    assert [s for s, _ in curve] == list(range(0, alarm["step"] + 1, 2))
    # RL's Razor's predictor beside the scores: 0 at the start, grown by the fall
    kl = report["kl"]["nodigits"]
    assert [s for s, _ in kl] == [s for s, _ in curve] and kl[0] == [0, 0.0] and kl[-1][1] > 0.0
    # each check is a real eval run: per-sample lines, served by the adapter being trained
    assert (session.paths.output_dir / "monitor" / "rollout_00000" / "samples" / "nodigits.jsonl").is_file()


@pytest.mark.slow
def test_the_monitor_stays_quiet_when_nothing_is_forgotten_and_keeps_the_policy(tmp_path):
    session = stage(tmp_path, 1e-7, "action=keep")
    metrics = run_stage(session)
    report = metrics["monitor"]
    assert report["alarms"] == [] and not report["stopped"] and len(metrics["steps"]) == 8
    assert [s for s, _ in report["curves"]["nodigits"]] == [0, 2, 4, 6, 8]
    assert (session.paths.output_dir / "monitor" / "kept_adapter" / "adapter_config.json").is_file()
    assert "kept_adapter" not in report  # nothing fell: the stage's own adapter is the one to use


def test_a_local_monitor_reads_a_stage_bound_suite(tmp_path):
    """recipes/eval/paper.yaml names the stage each dataset reproduces: the local stage's monitor binds them with the
    recipes' stage reader (without it: 'load the suite with a stage reader')."""
    from pathlib import Path

    from aclarena_slime.local.stage import stage_monitor

    paper = Path(__file__).resolve().parents[2] / "recipes" / "eval" / "paper.yaml"
    monitor = stage_monitor({"enabled": True, "domains": ["math"], "suite": str(paper)}, "http://127.0.0.1:1",
                            tmp_path, "ifeval", tmp_path / "adapter")  # fmt: skip
    (aime,) = monitor.suite.datasets
    assert (aime.name, aime.max_response_len) == ("aime26", 16384)  # stage1_math's budget, from its compiled command
