"""Parallel MLE on the local backend: experts trained side by side on one backbone equal experts trained alone."""

from __future__ import annotations

import dataclasses
import json
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aclarena_slime.experts import ExpertTable
from aclarena_slime.local.config import LocalConfigError
from aclarena_slime.local.parallel_mle import MultiExpertTrainer, open_experts, run_parallel_mle
from aclarena_slime.local.run import _local_env, expert_sessions
from aclarena_slime.local.stage import run_stage
from aclarena_slime.local.trainer import PolicyTrainer, TrainSample
from aclarena_slime.lora.config import LoraConfig
from aclarena_slime.plugin import registry
from aclarena_slime.testing.local import LEARNABLE, local_recipe, local_session, trainer_settings

REPO = Path(__file__).resolve().parents[2]
LORA = LoraConfig(rank=4, alpha=8.0, adapter_name=None, target_modules=["linear_qkv", "linear_fc2"])


@pytest.fixture(autouse=True)
def _learnable_registered():
    from aclarena_envs.learnable.env import LearnableEnvironment

    registry.register("learnable", LearnableEnvironment)


def _samples(offset: int) -> list[TrainSample]:
    """Two GRPO groups of two rollouts with different rewards (so every sample has an advantage)."""
    out = []
    for i in range(4):
        tokens = [5 + offset, 9, 11 + i, 20 + offset + i, 30 + i]
        out.append(TrainSample(tokens, 3, [1, 1, 1], [-6.0, -6.0, -6.0], float(i % 2), i // 2))
    return out


def test_each_sample_trains_only_its_own_expert(tiny_model_dir):
    """One step of two experts on one backbone equals each expert's step alone, to float32 round-off
    (1e-6); an expert without samples keeps its adapter exactly."""
    settings = trainer_settings(kl_coef=0.1, lr=5e-2, micro_batch_size=2)
    multi = MultiExpertTrainer.build(tiny_model_dir, {"one": (settings, LORA), "two": (settings, LORA)}, seed=3)
    start_b = multi.adapter_state("two")
    multi.step("one", _samples(0))
    assert all(torch.equal(v, multi.adapter_state("two")[k]) for k, v in start_b.items())  # two untouched by one's loss
    multi.step("two", _samples(7))
    for name, offset in (("one", 0), ("two", 7)):
        alone = PolicyTrainer.build(tiny_model_dir, settings, LORA, seed=3)
        alone.step(_samples(offset))
        from peft import get_peft_model_state_dict

        expected = get_peft_model_state_dict(alone.model)
        got = multi.adapter_state(name)
        assert set(got) == set(expected)
        moved = max(float((expected[k] - start_b[k]).abs().max()) for k in expected)
        assert moved > 1e-4  # the step did change the adapter
        assert max(float((got[k] - expected[k]).abs().max()) for k in expected) < 1e-6, name


def test_mismatched_experts_are_refused(tmp_path):
    a = local_session(tmp_path / "a", *LEARNABLE)
    with pytest.raises(LocalConfigError, match="one expert per env tag"):
        open_experts([a, a])
    mock = (*LEARNABLE, "data.env=mock", "+env_config.mock={}")
    other = local_session(tmp_path / "b", *mock, "++cluster.local.seed=1")
    with pytest.raises(LocalConfigError, match="seed is 0 for 'learnable' but 1 for 'mock'"):
        open_experts([a, other])
    full = local_session(tmp_path / "b", *mock, "lora.enabled=false")
    with pytest.raises(LocalConfigError, match="full_finetune=True is not supported"):
        open_experts([a, full])
    warm = local_session(tmp_path / "b", *mock, "++cluster.local.warm_start_steps=3", "++cluster.local.warm_start_demos=x.y")
    with pytest.raises(LocalConfigError, match="warm_start_steps=3 is not supported"):
        open_experts([a, warm])
    wide = local_session(tmp_path / "b", *mock, "++cluster.local.max_prefill_tokens=99")
    with pytest.raises(LocalConfigError, match="max_prefill_tokens is .* but 99 for 'mock'"):
        open_experts([a, wide])


def test_the_experts_sessions_are_the_stages_with_each_tags_env_adapter_and_folder(tmp_path):
    """expert_sessions makes each expert's session from the stage's: the stage's parts, with the tag's env, env
    settings, LoRA adapter name and folder and no warm start."""
    recipe = local_recipe(tmp_path, "lora.experts=[math,ifeval]", recipe=REPO / "recipes" / "mle_parallel.yaml")
    stage = local_session(tmp_path, "lora.experts=[math,ifeval]", recipe=REPO / "recipes" / "mle_parallel.yaml")
    with pytest.warns(UserWarning, match="without the warm start") if stage.warm_start else nullcontext():
        sessions = expert_sessions(stage, recipe.env_config)
    assert [s.env for s in sessions] == ["math", "ifeval"]
    for session in sessions:
        tag = session.env
        env_config = stage.records.env_config if tag == stage.env else {**recipe.env_config.get(tag, {}),
                                                                          **_local_env(tag)}  # fmt: skip
        assert session.records == dataclasses.replace(stage.records, env=tag, env_config=env_config, warm_start_records=0)
        assert session.policy.lora == dataclasses.replace(stage.policy.lora, adapter_name=tag, experts=None)
        assert (session.policy.name, session.policy.train) == (tag, stage.policy.train)
        assert session.paths == dataclasses.replace(stage.paths, output_dir=stage.paths.output_dir / "experts" / tag)
        assert session.warm_start is None
        assert (session.model, session.engine, session.loop, session.sft) == (stage.model, stage.engine, stage.loop,
                                                                               stage.sft)  # fmt: skip
        assert session.settings["env"] == tag and session.settings["local"]["warm_start_steps"] == 0


def _session(tmp_path, env, *extra):
    sizes = ("rollout.num_rollout=2", "rollout.rollout_batch_size=2", "rollout.n_samples_per_prompt=4",
             "rollout.rollout_max_response_len=8", "++cluster.local.eval_size=2", "algorithm.lr=5e-2",
             "++cluster.local.torch_threads=1", "++cluster.local.progress=false", "++cluster.local.seed=1",
             "lora.rank=4", "lora.target_modules=[q_proj,v_proj,lm_head]")  # fmt: skip
    return local_session(tmp_path / f"alone-{env}", *LEARNABLE, f"data.env={env}", *sizes, *extra)


MOCK = ("++env_config.mock.max_turns=2",)


@pytest.mark.slow
def test_experts_side_by_side_end_within_noise_of_experts_alone(tmp_path):
    """Two experts (learnable, mock) in one job: one engine serving both, one trainer with two adapters.

    Each ends within 0.1% (L2 over the adapter) of the same expert trained alone with the same seeds and
    steps, measured against how far its B matrices moved from 0: the only difference is the float
    round-off of the engine's batches, which now hold both experts' requests. Adam turns that round-off
    into a visible move on the few parameters whose gradient nearly cancels (up to ~7e-4 absolute at lr
    5e-2 on a loaded machine, 2e-4 of the move in L2), so a per-parameter bound is flaky; the norm is not.
    one PEFT folder per expert and experts.json.
    """
    sessions = [_session(tmp_path, "learnable"), _session(tmp_path, "mock", *MOCK)]
    together = run_parallel_mle(open_experts(sessions), tmp_path / "parallel")
    table = ExpertTable.load(tmp_path / "parallel" / "experts.json")
    assert sorted(table.experts) == ["learnable", "mock"]
    moved = 0.0
    for session in sessions:
        alone = run_stage(session)
        mine = load_file(str(table.experts[session.env].path / "adapter_model.safetensors"))
        theirs = load_file(str(session.paths.adapter_dir / "adapter_model.safetensors"))
        assert set(mine) == set(theirs)
        gap = sum(float((mine[k] - theirs[k]).pow(2).sum()) for k in mine) ** 0.5
        move = sum(float(v.pow(2).sum()) for k, v in theirs.items() if "lora_B" in k) ** 0.5  # B starts at 0
        assert gap <= 1e-3 * move, (session.env, gap, move)
        moved = max(moved, *(float(v.abs().max()) for k, v in mine.items() if "lora_B" in k))
        rewards = [s["reward_mean"] for s in together["experts"][session.env]["steps"]]
        assert rewards == pytest.approx([s["reward_mean"] for s in alone["steps"]], abs=1e-9)
    assert moved > 1e-3
    metrics = json.loads((tmp_path / "parallel" / "metrics.json").read_text())
    assert metrics["kind"] == "parallel_mle" and set(metrics["experts"]) == {"learnable", "mock"}


@pytest.mark.slow
def test_parallel_mle_runs_the_stages_grpo_loop(tmp_path):
    """Parallel MLE is the N-expert case of the stage's GRPO loop: each expert gets the parity check on its first
    batch, its validation curve and the greedy evaluation beside a sampled one (its own loop had none of them)."""
    extra = ("rollout.num_rollout=1", "data.eval_temperature=0.7", "data.n_samples_per_eval_prompt=2")
    sessions = [
        _session(tmp_path, "learnable", "++cluster.local.validation_size=2", "++cluster.local.validation_interval=1",
                 *extra),  # fmt: skip
        _session(tmp_path, "mock", *MOCK, *extra),  # a handful of prompts: none to validate on
    ]
    metrics = run_parallel_mle(open_experts(sessions), tmp_path / "parallel")
    for env, expert in metrics["experts"].items():
        assert expert["steps"][0]["parity_max_abs"] < 1e-3, env
        assert set(expert["eval_greedy"]) == {"before", "after"} and expert["eval_greedy"]["after"]["n"] == 2, env
    assert [v["step"] for v in metrics["experts"]["learnable"]["eval_validation"]] == [0, 1]
    assert "eval_validation" not in metrics["experts"]["mock"]
