"""The local backend's SFT warm start: the shared filter, the cross-entropy step, and a whole stage."""

from __future__ import annotations

import json

import pytest

from aclarena_slime.local.config import LocalConfigError, LocalStageConfig
from aclarena_slime.local.losses import LossSettings
from aclarena_slime.local.records import Sample
from aclarena_slime.local.session import open_session
from aclarena_slime.local.spec import local_plan
from aclarena_slime.local.stage import keep, rollout_examples, run_stage, sft_filter
from aclarena_slime.local.trainer import PolicyTrainer, TrainSettings
from aclarena_slime.lora.config import LoraConfig


def filter_settings(values):
    return sft_filter(open_session(LocalStageConfig(env="math", output_dir="x", kind="sft", sft_filter=values)).sft)


def _sample(reward, status="completed", mask=(1, 1)):
    _sample.n = getattr(_sample, "n", 0) + 1  # distinct conversations: the filter drops exact duplicates
    messages = [{"role": "user", "content": f"q{_sample.n}"}, {"role": "assistant", "content": "a"}]
    sample = Sample(prompt="q", metadata={"env": "math", "aclarena": {"messages": messages}})
    sample.tokens, sample.loss_mask, sample.response_length = [5, 6, 7, 8], list(mask), 2
    sample.reward, sample.status = reward, Sample.Status(status)
    return sample


def test_the_filter_is_the_sft_data_pipelines_own():
    samples = [_sample(1.0), _sample(0.2), _sample(1.0, "truncated"), _sample(1.0, mask=(0, 0)), _sample(0.5)]
    kept, report = keep(samples, "math", filter_settings({"min_reward": 0.4, "statuses": ["completed", "truncated"]}))
    assert kept == [samples[0], samples[2], samples[4]]
    assert report.to_dict()["math"]["dropped"] == {"below_threshold": 1, "no_trainable_tokens": 1}
    kept, _ = keep(samples, "math", filter_settings({"min_reward": 1.0}))  # TauSFT: completed only
    assert kept == [samples[0]]
    with pytest.raises(LocalConfigError, match="sft_filter"):
        filter_settings({"threshold": 1.0})
    with pytest.raises(LocalConfigError, match="min_reward"):
        filter_settings({"statuses": ["completed"]})


def test_sft_steps_lower_the_loss_on_the_kept_tokens(tiny_model_dir):
    lora = LoraConfig(rank=4, alpha=8, dropout=0.0, target_modules=["q_proj", "lm_head"])
    settings = TrainSettings(loss=LossSettings(estimator="grpo", per_token=False, clip_low=0.2, clip_high=0.28, kl_coef=0.0,
                                    kl_loss_type="low_var_kl"), lr=5e-2, adam_betas=(0.9, 0.999), weight_decay=0.0,
                  temperature=1.0, updates_per_step=1, minibatches=1, micro_batch_size=8)  # fmt: skip
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
    cfg = LocalStageConfig(
        env="math", output_dir=str(tmp_path / "sft"), steps=1, prompts_per_step=2, samples_per_prompt=2,
        eval_size=1, max_response_len=12, progress=False, torch_threads=1, kind="sft", sft_epochs=2,
        sft_filter={"min_reward": 0.0, "statuses": ["completed", "truncated"]},
    )  # fmt: skip
    metrics = run_stage(cfg)
    assert metrics["kind"] == "sft" and metrics["teacher_rollouts"] == 4
    assert metrics["kept"] == metrics["filter"]["kept"] >= 1
    assert [step["epoch"] for step in metrics["steps"]] == [0, 1]
    assert json.loads((tmp_path / "sft" / "metrics.json").read_text())["kept"] == metrics["kept"]
    assert (tmp_path / "sft" / "adapter" / "adapter_config.json").exists()


def test_an_sft_stage_takes_slimes_global_batch_one_optimiser_step_per_contiguous_part(tmp_path):
    """rollout.num_steps_per_rollout (or global_batch_size) on an SFT stage: each epoch is that many optimiser
    steps over the kept rollouts in order, as slime trains its SFT data (it used to be one step an epoch)."""
    cfg = LocalStageConfig(
        env="math", output_dir=str(tmp_path / "sft"), steps=1, prompts_per_step=2, samples_per_prompt=2,
        eval_size=1, max_response_len=12, progress=False, torch_threads=1, kind="sft", sft_epochs=1,
        steps_per_rollout=2, sft_filter={"min_reward": 0.0, "statuses": ["completed", "truncated"]},
    )  # fmt: skip
    metrics = run_stage(cfg)
    assert metrics["kept"] == 4
    assert [(step["epoch"], step["samples"]) for step in metrics["steps"]] == [(0, 2.0), (0, 2.0)]
    assert "2 optimiser steps an epoch" in local_plan(open_session(cfg))
