"""The local backend's SFT warm start: the shared filter, the cross-entropy step, and a whole stage."""

from __future__ import annotations

import json

import pytest

from aclarena_slime.local.records import Sample
from aclarena_slime.local.run import local_plan
from aclarena_slime.local.stage import keep, rollout_examples, run_stage, sft_filter
from aclarena_slime.local.trainer import PolicyTrainer
from aclarena_slime.lora.config import LoraConfig
from aclarena_slime.testing.local import LEARNABLE, local_session, trainer_settings


def filter_settings(root, values: str):
    """The SFT stage's filter as the recipe's ``custom.aclarena_sft_filter`` gives it (``values``: its YAML)."""
    return sft_filter(local_session(root, *SFT_MATH, f"++custom.aclarena_sft_filter={values}").sft)


SFT_MATH = (*LEARNABLE, "data.env=math", "kind=sft")


# A one-step SFT stage on math: the teacher's 2 prompts x 2 samples of 12 tokens, kept when completed or cut short.
SFT_STAGE = (*SFT_MATH, "rollout.num_rollout=1", "rollout.rollout_batch_size=2", "rollout.n_samples_per_prompt=2",
             "++cluster.local.eval_size=1", "rollout.rollout_max_response_len=12", "++cluster.local.progress=false",
             "++cluster.local.torch_threads=1",
             "++custom.aclarena_sft_filter={min_reward: 0.0, statuses: [completed, truncated]}")  # fmt: skip


def _sample(reward, status="completed", mask=(1, 1)):
    _sample.n = getattr(_sample, "n", 0) + 1  # distinct conversations: the filter drops exact duplicates
    messages = [{"role": "user", "content": f"q{_sample.n}"}, {"role": "assistant", "content": "a"}]
    sample = Sample(prompt="q", metadata={"env": "math", "aclarena": {"messages": messages}})
    sample.tokens, sample.loss_mask, sample.response_length = [5, 6, 7, 8], list(mask), 2
    sample.reward, sample.status = reward, Sample.Status(status)
    return sample


def test_the_filter_is_the_sft_data_pipelines_own(tmp_path):
    samples = [_sample(1.0), _sample(0.2), _sample(1.0, "truncated"), _sample(1.0, mask=(0, 0)), _sample(0.5)]
    kept, report = keep(samples, "math", filter_settings(tmp_path, "{min_reward: 0.4, statuses: [completed, truncated]}"))
    assert kept == [samples[0], samples[2], samples[4]]
    assert report.to_dict()["math"]["dropped"] == {"below_threshold": 1, "no_trainable_tokens": 1}
    kept, _ = keep(samples, "math", filter_settings(tmp_path, "{min_reward: 1.0}"))  # TauSFT: completed only
    assert kept == [samples[0]]
    with pytest.raises(ValueError, match="threshold"):
        filter_settings(tmp_path, "{threshold: 1.0}")
    with pytest.raises(ValueError, match="min_reward"):
        filter_settings(tmp_path, "{statuses: [completed]}")


def test_sft_steps_lower_the_loss_on_the_kept_tokens(tiny_model_dir):
    lora = LoraConfig(rank=4, alpha=8, dropout=0.0, target_modules=["q_proj", "lm_head"])
    settings = trainer_settings(lr=5e-2)
    trainer = PolicyTrainer.build(tiny_model_dir, settings, lora)
    sample = Sample(prompt="q", metadata={"env": "math"})
    sample.tokens, sample.response_length, sample.loss_mask = [3, 4, 5, 6, 7, 8], 3, [1, 0, 1]
    examples = rollout_examples([sample])
    assert examples[0].loss_mask == [0, 0, 0, 1, 0, 1]  # the prompt is context, the mask-1 tokens are trained
    losses = [trainer.sft_step(examples)["loss"] for _ in range(5)]
    assert losses[-1] < losses[0]
    empty = Sample(prompt="q", metadata={"env": "math"})
    empty.tokens, empty.response_length, empty.loss_mask = [1, 2], 1, [0]
    assert rollout_examples([empty]) == []


def test_a_warm_start_stage_writes_an_adapter_the_next_stage_can_start_from(tmp_path):
    session = local_session(tmp_path, *SFT_STAGE, "++algorithm.extra.num_epoch=2")
    out = session.paths.output_dir
    metrics = run_stage(session)
    assert metrics["kind"] == "sft" and metrics["teacher_rollouts"] == 4
    assert metrics["kept"] == metrics["filter"]["kept"] >= 1
    assert [step["epoch"] for step in metrics["steps"]] == [0, 1]
    assert json.loads((out / "metrics.json").read_text())["kept"] == metrics["kept"]
    assert (out / "adapter" / "adapter_config.json").exists()


def test_an_sft_stage_takes_slimes_global_batch_one_optimiser_step_per_contiguous_part(tmp_path):
    """rollout.num_steps_per_rollout (or global_batch_size) on an SFT stage: each epoch is that many optimiser
    steps over the kept rollouts in order, as slime trains its SFT data (it used to be one step an epoch)."""
    session = local_session(tmp_path, *SFT_STAGE, "++algorithm.extra.num_epoch=1", "rollout.num_steps_per_rollout=2")
    metrics = run_stage(session)
    assert metrics["kept"] == 4
    assert [(step["epoch"], step["samples"]) for step in metrics["steps"]] == [(0, 2.0), (0, 2.0)]
    assert "2 optimiser steps an epoch" in local_plan(session)
