"""The trainer's pieces: GRPO advantages, the clipped loss, the export, and one real step (the loss's equality
with slime's: tests/local/test_losses.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from aclarena_slime.kl import approx_kl
from aclarena_slime.local.losses import LossSettings, policy_loss
from aclarena_slime.local.parts import KlTerm
from aclarena_slime.local.trainer import PolicyTrainer, TrainSample
from aclarena_slime.lora.config import LoraConfig
from aclarena_slime.testing.local import trainer_settings


def grpo_advantages(rewards, groups):
    from aclarena_slime.local.losses import advantages

    return advantages("grpo", rewards, groups)


def ppo_clipped_loss(new, old, adv, mask, clip_low, clip_high):
    """The per-token PPO clip, summed over the mask (the token aggregation), and the clipped tokens."""
    terms = policy_loss(new, old, adv, mask, LossSettings(estimator="grpo", per_token=True, clip_low=clip_low,
                                                        clip_high=clip_high, kl=KlTerm(0.0, "low_var_kl")))  # fmt: skip
    return terms.loss, terms.clipped


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
    settings = trainer_settings(lr=5e-2, micro_batch_size=2)
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


def test_a_padded_batch_gives_each_sample_its_log_probs_alone(trainer):
    """Samples of different lengths share one right-padded forward without an attention mask: the causal mask keeps
    every real token off the padding after it, so each sample's log-probs are those of its forward alone (to
    float32 round-off: a batch of another shape sums in another order)."""
    samples = [rollout(trainer, [5, 6, 7] * k, [40 + k, 41, 42][: 1 + k % 3], 1.0, 0) for k in (1, 4, 2, 7)]
    together = trainer.recompute_log_probs(samples)  # micro-batches of 2: each pads its shorter sample
    alone = [trainer.recompute_log_probs([s])[0] for s in samples]
    assert together == [pytest.approx(lp, abs=1e-5) for lp in alone]
    assert [len(lp) for lp in together] == [s.response_length for s in samples]
    assert together == [pytest.approx(s.rollout_log_probs, abs=1e-5) for s in samples]  # the engine's numbers


def test_a_forward_without_gradient_drops_the_padding_mask_and_changes_no_logit(trainer):
    """The reference's and the parity check's forwards run without the padding mask (the causal kernel, several
    times as fast on long prompts); the logits at real positions are exactly those the masked forward, the one that
    trains, gives."""
    from aclarena_slime.local.sft import right_padded_logits

    masks: list[bool] = []

    def model(**inputs):
        masks.append("attention_mask" in inputs)
        return trainer.model(**inputs)

    sequences = [[5, 6, 7] * 9 + [40, 41], [8, 9] * 4, [11, 12, 13] * 5]
    with torch.no_grad():
        _, causal = right_padded_logits(model, sequences, trainer.pad_id)
    _, masked = right_padded_logits(model, sequences, trainer.pad_id)
    assert masks == [False, True] and masked.requires_grad and not causal.requires_grad
    assert all(torch.equal(causal[i, : len(s)], masked[i, : len(s)].detach()) for i, s in enumerate(sequences))


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


@pytest.mark.parametrize("per_token", [False, True])
def test_a_step_aggregates_its_loss_as_the_recipe_says(tiny_model_dir, per_token):
    """slime's default is the per-sample mean (each sample's token mean, averaged over the samples):
    on-policy (ratio 1) a group's loss is then minus its mean advantage, 0; the token mean (slime's
    calculate_per_token_loss) weighs the longer samples more, here the rewarded 3-token one."""
    settings = trainer_settings(lr=5e-2, micro_batch_size=1, per_token=per_token)
    trainer = PolicyTrainer.build(tiny_model_dir, settings, lora(), seed=0)
    samples = [rollout(trainer, [5, 6, 7], [40, 41, 42], 1.0, 0), rollout(trainer, [5, 6, 7], [90], 0.0, 0)]
    stats = trainer.step(samples)
    a = 1 / 2**0.5  # the group's advantages: +-(0.5 / n-1 std 0.707)
    assert stats["loss"] == pytest.approx(-(3 * a - a) / 4 if per_token else 0.0, abs=1e-5)


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


def _group(trainer):
    prompt, good, bad = [5, 6, 7], [40, 41, 42], [90, 91]
    return [rollout(trainer, prompt, good, 1.0, 0), rollout(trainer, prompt, bad, 0.0, 0)]


def _backbone(model):
    """The backbone's own weights (a PEFT model's base layers), by their plain names."""
    return {
        n.replace("base_model.model.", "").replace(".base_layer", ""): p.detach().clone()
        for n, p in model.named_parameters()
        if "lora_" not in n
    }


def test_full_fine_tuning_changes_the_backbone_and_lora_does_not(tiny_model_dir, tmp_path):
    """lora.enabled=false on the local backend: every parameter trains (AdamW), and the export is a model folder."""
    from transformers import AutoModelForCausalLM

    settings = trainer_settings(lr=1e-2, micro_batch_size=2, weight_decay=0.1, adam_betas=(0.9, 0.98))
    full = PolicyTrainer.build(tiny_model_dir, settings, None, seed=0)
    assert full.full and len(full.params) == len(list(full.model.parameters()))
    assert (
        full.optimizer.param_groups[0]["betas"] == (0.9, 0.98) and full.optimizer.param_groups[0]["weight_decay"] == 0.1
    )
    before = _backbone(full.model)
    full.step(_group(full))
    changed = [n for n, p in _backbone(full.model).items() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)  # every backbone weight moved
    saved = full.save(tmp_path / "model")
    reloaded = AutoModelForCausalLM.from_pretrained(saved)
    assert torch.equal(reloaded.lm_head.weight, full.model.lm_head.weight)
    assert (saved / "tokenizer_config.json").exists()  # a folder the engine and the next stage load as they are

    lora = PolicyTrainer.build(tiny_model_dir, settings, LoraConfig(rank=4, alpha=8, target_modules=["q_proj"]), seed=0)
    before = _backbone(lora.model)
    lora.step(_group(lora))
    assert all(torch.equal(p, before[n]) for n, p in _backbone(lora.model).items())


def test_full_fine_tuning_syncs_its_weights_into_the_engine(tiny_model_dir):
    from aclarena_slime.local.engine import open_engine

    trainer = PolicyTrainer.build(tiny_model_dir, trainer_settings(lr=1e-2, micro_batch_size=2), None, seed=0)
    engine = open_engine(tiny_model_dir, seed=0)
    trainer.step(_group(trainer))
    assert not torch.equal(engine.model.base.lm_head.weight, trainer.model.lm_head.weight)
    engine.update_weights(trainer.model.state_dict())  # the stage's sync (stage.serve_policy)
    assert torch.equal(engine.model.base.lm_head.weight, trainer.model.lm_head.weight)


def test_the_kl_estimators_are_slimes_on_fixed_tensors():
    """slime's compute_approx_kl (slime/utils/ppo_utils.py): log r = logp - logp_ref; k3/low_var_kl is
    exp(-log r) - 1 + log r, and low_var_kl alone is clamped to [-10, 10]."""
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.3, 1e-9]]))
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.3, 0.9]]))
    log_r = math.log(2.0)
    expected = [0.5 - 1 + log_r, 2.0 - 1 - log_r, 0.0, 10.0]  # the last one is clamped (exp(20.6) - 1 - 20.6)
    assert approx_kl(logp, ref, "low_var_kl")[0].tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert approx_kl(logp, ref, "k3")[0, 3] > 10  # k3 is not clamped
    assert approx_kl(logp, ref, "k1")[0, :2].tolist() == pytest.approx([log_r, -log_r], rel=1e-6)
    assert approx_kl(logp, ref, "k2")[0, 0] == pytest.approx(log_r**2 / 2, rel=1e-6)
    assert torch.all(approx_kl(ref, ref) == 0)  # zero at the reference ...
    assert torch.all(approx_kl(logp[:, :2], ref[:, :2]) > 0)  # ... positive away from it
    with pytest.raises(ValueError, match="kl_loss_type"):
        approx_kl(logp, ref, "k9")


def test_the_kl_term_is_zero_at_the_reference_and_changes_the_loss_away_from_it(tiny_model_dir):
    """The KL anchor's stage trains a different loss than the sequential one: the same rollouts, the same
    seed, two updates per step (the second away from the reference) give different losses and weights."""
    lora = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "lm_head"])
    runs = {}
    for coef in (0.0, 1.0):
        trainer = PolicyTrainer.build(tiny_model_dir, trainer_settings(lr=5e-2, updates_per_step=2, kl_coef=coef), lora)
        samples = _group(trainer)
        runs[coef] = (trainer.step(samples), [p.detach().clone() for p in trainer.params])
    plain, anchored = runs[0.0][0], runs[1.0][0]
    assert "kl" not in plain and anchored["kl"] > 0  # after the first update the policy has left the reference
    assert anchored["loss"] != pytest.approx(plain["loss"], rel=1e-6, abs=1e-9)
    assert any(not torch.equal(a, b) for a, b in zip(runs[0.0][1], runs[1.0][1], strict=True))
    at_reference = PolicyTrainer.build(tiny_model_dir, trainer_settings(lr=5e-2, kl_coef=1.0), lora)
    samples = _group(at_reference)
    with torch.no_grad():
        new, _, mask, _, _ = at_reference._batch_log_probs(samples, [0.0, 0.0])
        ref, _, _, _, _ = at_reference._batch_log_probs(samples, [0.0, 0.0], at_reference.reference)
    assert float((approx_kl(new, ref) * mask).sum()) == 0.0  # the reference is the policy the stage starts from


def _two_groups(trainer):
    """Two prompts' groups, contiguous, each with a reward spread."""
    first = [rollout(trainer, [5, 6, 7], [40, 41, 42], 1.0, 0), rollout(trainer, [5, 6, 7], [90, 91], 0.0, 0)]
    second = [rollout(trainer, [8, 9], [60, 61], 0.0, 1), rollout(trainer, [8, 9], [70], 1.0, 1)]
    return first, second


def test_minibatches_are_slimes_steps_per_rollout_one_optimiser_step_per_contiguous_part(tiny_model_dir):
    """rollout.global_batch_size below a rollout's samples: slime trains the rollout in contiguous steps of that
    many samples. Two parts of whole groups train exactly as the two halves stepped one after the other."""
    lora_config = LoraConfig(rank=4, alpha=8, dropout=0.0, target_modules=["q_proj", "lm_head"])
    split = PolicyTrainer.build(tiny_model_dir, trainer_settings(lr=5e-2, minibatches=2), lora_config, seed=0)
    halves = PolicyTrainer.build(tiny_model_dir, trainer_settings(lr=5e-2), lora_config, seed=0)
    first, second = _two_groups(split)
    stats = split.step(first + second)
    assert stats["updates"] == 2.0 and "skipped" not in stats
    assert stats["logprob_mismatch"] < 1e-5  # measured on the first part, before any update: on-policy
    halves.step(first)
    halves.step(second)
    for a, b in zip(split.params, halves.params, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    one = PolicyTrainer.build(tiny_model_dir, trainer_settings(lr=5e-2), lora_config, seed=0)
    assert one.step(first + second)["updates"] == 1.0
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(one.params, split.params, strict=True))


def test_a_part_whose_groups_all_score_alike_is_skipped(tiny_model_dir):
    lora_config = LoraConfig(rank=4, alpha=8, dropout=0.0, target_modules=["q_proj", "lm_head"])
    trainer = PolicyTrainer.build(tiny_model_dir, trainer_settings(lr=5e-2, minibatches=2), lora_config, seed=0)
    first, second = _two_groups(trainer)
    uniform = [TrainSample(s.tokens, s.response_length, s.loss_mask, s.rollout_log_probs, 1.0, 0) for s in first]
    stats = trainer.step(uniform + second)
    assert stats["updates"] == 1.0 and "skipped" not in stats
    assert "entropy" in stats and "grad_norm" not in stats  # the first part measured, not trained
    with pytest.raises(ValueError, match="minibatches"):
        trainer_settings(minibatches=0)
