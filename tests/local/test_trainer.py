"""The trainer's pieces: GRPO advantages, the clipped loss, the export, and one real step."""

from __future__ import annotations

import json

import pytest
import torch

from aclarena_slime.local.trainer import PolicyTrainer, TrainSample, TrainSettings, grpo_advantages, ppo_clipped_loss
from aclarena_slime.lora.config import LoraConfig


def test_grpo_advantages_are_normalised_per_group():
    adv = grpo_advantages([1.0, 0.0, 1.0, 0.0, 0.5, 0.5], [0, 0, 0, 0, 1, 1])
    # slime's n-1 standard deviation: rewards 1, 0, 1, 0 have std sqrt(1/3), so each is 0.5 / 0.577 away
    assert adv[:4] == pytest.approx([0.866, -0.866, 0.866, -0.866], abs=1e-3)
    assert adv[4:] == [0.0, 0.0]  # a group with one reward teaches nothing
    assert grpo_advantages([3.0], [0]) == [0.0]


def test_the_local_trainer_normalises_groups_as_slime_does():
    """One GRPO normalisation: the local trainer's advantages are group_rewards' (slime's, n-1 std)."""
    from types import SimpleNamespace

    from aclarena_slime.group_rewards import GroupNormalization, normalized_rewards

    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.3, 0.9, 0.1, 0.2, 0.4, 0.8, 0.6, 0.0]
    groups = [0] * 8 + [1] * 8
    samples = [SimpleNamespace(group_index=g, remove_sample=False) for g in groups]
    assert grpo_advantages(rewards, groups) == pytest.approx(
        normalized_rewards(samples, rewards, GroupNormalization("grpo", group_size=8)), abs=1e-9
    )


def test_clipped_loss_caps_the_ratio_on_the_side_the_advantage_pushes():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.0, 2.0, 0.5]]))  # ratios 1, 2, 0.5
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    loss, clipped = ppo_clipped_loss(new, old, torch.ones(1, 3), mask, 0.2, 0.28)
    # A > 0: ratio 2 is capped at 1.28; ratio 0.5 keeps its own (smaller) value.
    assert float(loss) == pytest.approx(-(1.0 + 1.28 + 0.5))
    assert float(clipped) == 1.0
    loss, clipped = ppo_clipped_loss(new, old, -torch.ones(1, 3), mask, 0.2, 0.28)
    assert float(loss) == pytest.approx(1.0 + 2.0 + 0.8)  # A < 0: ratio 0.5 is held at 0.8
    masked, _ = ppo_clipped_loss(new, old, torch.ones(1, 3), torch.tensor([[1.0, 0.0, 0.0]]), 0.2, 0.28)
    assert float(masked) == pytest.approx(-1.0)  # masked tokens count nowhere


@pytest.fixture
def trainer(tiny_model_dir):
    settings = TrainSettings(lr=5e-2, micro_batch_size=2)
    return PolicyTrainer.build(tiny_model_dir, settings, lora(), seed=0)


def lora():
    return LoraConfig(rank=4, alpha=8, dropout=0.0, target_modules=["q_proj", "lm_head"])


def rollout(trainer, prompt, response, reward, group, mask=None):
    """A sample whose rollout log-probs are the current policy's (so the step starts on-policy)."""
    tokens = prompt + response
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([tokens])).logits[0, len(prompt) - 1 : -1]
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1).tolist()
    return TrainSample(tokens, len(response), mask or [1] * len(response), lp, reward, group)


def sequence_log_prob(trainer, prompt, response):
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return float(torch.log_softmax(logits, -1).gather(-1, torch.tensor(response).unsqueeze(-1)).sum())


def test_a_step_raises_the_rewarded_response_and_reproduces_rollout_log_probs(trainer):
    prompt, good, bad = [5, 6, 7], [40, 41, 42], [90, 91]
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)  # backbone frozen
    frozen_before = {n: p.clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    before = sequence_log_prob(trainer, prompt, good) - sequence_log_prob(trainer, prompt, bad)
    samples = [
        rollout(trainer, prompt, good, 1.0, 0),
        rollout(trainer, prompt, bad, 0.0, 0),
        rollout(trainer, prompt, good, 1.0, 0),
        rollout(trainer, prompt, bad + [3], 0.0, 0, [1, 1, 0]),
    ]
    stats = trainer.step(samples)
    assert stats["logprob_mismatch"] < 1e-5
    assert stats["loss_tokens"] == 3 + 2 + 3 + 2
    after = sequence_log_prob(trainer, prompt, good) - sequence_log_prob(trainer, prompt, bad)
    assert after > before + 0.1
    assert all(torch.equal(p, frozen_before[n]) for n, p in trainer.model.named_parameters() if not p.requires_grad)


def test_uniform_groups_skip_the_update(trainer):
    before = [p.clone() for p in trainer.params]
    stats = trainer.step([rollout(trainer, [5, 6], [7], 1.0, 0), rollout(trainer, [5, 6], [8], 1.0, 0)])
    assert stats["skipped"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.params, strict=True))


def test_save_is_a_peft_directory_and_replaces_the_old_one(trainer, tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = trainer.save(tmp_path / "adapter")
    trainer.step([rollout(trainer, [5], [9, 10], 1.0, 0), rollout(trainer, [5], [11], 0.0, 0)])
    trainer.save(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]  # no staging or retired folders left
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out)
    ids = torch.tensor([[5, 9, 10]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, trainer.model(input_ids=ids).logits, atol=1e-5)
