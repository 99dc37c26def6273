"""The local loss is slime's: for each recipe group of recipes/algorithm/, on the same tensors, the local loss
(aclarena_slime.local.losses) and its gradient equal what slime's ``loss_function`` gives.

slime is not importable here, so the expected values are a stored case (slime_loss_cases.json): slime's own
``loss_function`` / ``policy_loss_function`` / ``sft_loss_function`` (THUDM/slime@624b824a8) run on CPU with
Megatron stubbed to one rank and the log-probs handed in directly (as in :func:`_slime_case` below). Where
slime imports, the ``slime``-marked test recomputes the cases live.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from aclarena_slime.local.losses import LossSettings, advantages, aggregate, denominator, policy_loss
from aclarena_slime.local.parts import KlTerm

REPO = Path(__file__).resolve().parents[2]
CASES = json.loads((Path(__file__).with_name("slime_loss_cases.json")).read_text())
INPUTS = CASES["inputs"]
GROUPS = sorted(p.stem for p in (REPO / "recipes" / "algorithm").glob("*.yaml"))


def _padded(rows: list[list[float]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0.0] * (width - len(r)) for r in rows])


def _loss(estimator: str, kl_coef: float = 0.0) -> LossSettings:
    return LossSettings(estimator=estimator, per_token=False, clip_low=0.2, clip_high=0.28,
                        kl=KlTerm(kl_coef, "low_var_kl"))  # fmt: skip


def _settings(case: dict) -> LossSettings:
    s = case["settings"]
    return LossSettings(
        estimator=s["advantage_estimator"], per_token=s["calculate_per_token_loss"], clip_low=s["eps_clip"],
        clip_high=s["eps_clip_high"], kl=KlTerm(s["kl_loss_coef"] if s["use_kl_loss"] else 0.0, s["kl_loss_type"]),
    )  # fmt: skip


def local_loss(case: dict, inputs: dict) -> tuple[float, list[list[float]]]:
    """The local loss of the case's optimiser step (split into two micro-batches, as the trainer may) and its
    gradient with respect to the policy's log-probs."""
    lengths, masks = inputs["response_lengths"], inputs["loss_masks"]
    new = _padded(inputs["log_probs"]).requires_grad_(True)
    old, ref, mask = _padded(inputs["old_log_probs"]), _padded(inputs["ref_log_probs"]), _padded(masks)
    adv = torch.tensor(inputs["advantages"]).unsqueeze(1).expand_as(mask)
    settings = _settings(case)
    per_step = denominator(masks, settings.per_token)
    total = 0.0
    for rows in (slice(0, 2), slice(2, None)):
        if case["settings"]["loss_type"] == "sft_loss":
            loss = -aggregate(new[rows], mask[rows], settings.per_token)
        else:
            loss = policy_loss(new[rows], old[rows], adv[rows], mask[rows], settings, ref[rows]).loss
        (loss / per_step).backward()
        total += float(loss.detach()) / per_step
    return total, [new.grad[i, :n].tolist() for i, n in enumerate(lengths)]


def test_every_recipe_group_has_a_stored_case_for_both_aggregations():
    stored = {(c["group"], c["settings"]["calculate_per_token_loss"]) for c in CASES["cases"]}
    assert stored == {(g, per_token) for g in GROUPS for per_token in (False, True)}


@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: f"{c['group']}-per_token={c['settings']['calculate_per_token_loss']}")
def test_the_stored_case_is_the_recipes_algorithm(case):
    """A case stays the recipe group's: its settings are what recipes/algorithm/<group>.yaml says now."""
    algo = yaml.safe_load((REPO / "recipes" / "algorithm" / f"{case['group']}.yaml").read_text())
    s = case["settings"]
    assert s["advantage_estimator"] == algo.get("advantage_estimator", "grpo")
    assert s["eps_clip"] == algo.get("eps_clip", 0.2)
    assert s["eps_clip_high"] == (algo.get("eps_clip_high") or algo.get("eps_clip", 0.2))
    assert (s["use_kl_loss"], s["kl_loss_coef"]) == (algo.get("use_kl_loss", False), algo.get("kl_loss_coef", 0.0))
    assert s["entropy_coef"] == algo.get("entropy_coef", 0.0) == 0.0  # the local trainer has no entropy bonus


@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: f"{c['group']}-per_token={c['settings']['calculate_per_token_loss']}")
def test_the_local_loss_equals_slimes_on_the_same_tensors(case):
    loss, grad = local_loss(case, INPUTS)
    assert loss == pytest.approx(case["expected"]["loss"], rel=1e-5, abs=1e-7)
    for mine, slimes in zip(grad, case["expected"]["grad"], strict=True):
        assert mine == pytest.approx(slimes, rel=1e-4, abs=1e-7)


def test_the_aggregations_differ_on_these_tensors_and_the_clip_engages():
    """The cases could fail: per-sample and per-token means differ here, and GRPO's clip is active."""
    by = {(c["group"], c["settings"]["calculate_per_token_loss"]): c["expected"] for c in CASES["cases"]}
    assert abs(by["grpo", False]["loss"] - by["grpo", True]["loss"]) > 1e-2
    assert abs(by["grpo", False]["loss"] - by["gspo", False]["loss"]) > 1e-3
    assert by["grpo", False]["slime_metrics"]["pg_clipfrac"] > 0


def test_grpo_and_gspo_advantages_are_slimes_group_normalisation():
    groups = [i // INPUTS["group_size"] for i in range(len(INPUTS["rewards"]))]
    for estimator in ("grpo", "gspo"):
        assert advantages(estimator, INPUTS["rewards"], groups) == pytest.approx(INPUTS["advantages"], abs=1e-5)


def test_gspo_takes_one_ratio_per_sample():
    """GSPO's ratio is exp of the sample's mean log-ratio: a sample whose tokens moved +0.5 and -0.5 has ratio 1."""
    new, old = torch.tensor([[0.5, -0.5, 3.0]]), torch.zeros(1, 3)
    mask, adv = torch.tensor([[1.0, 1.0, 0.0]]), torch.ones(1, 3)
    gspo = policy_loss(new, old, adv, mask, _loss("gspo"))
    grpo = policy_loss(new, old, adv, mask, _loss("grpo"))
    assert float(gspo.pg_loss) == pytest.approx(-1.0) and float(gspo.clipped) == 0.0
    assert float(grpo.pg_loss) == pytest.approx(-(1.28 + torch.exp(torch.tensor(-0.5)).item()) / 2)


def test_an_unknown_estimator_or_a_kl_term_without_a_reference_is_refused():
    with pytest.raises(ValueError, match="advantage_estimator must be one of grpo, gspo, got 'ppo'"):
        _loss("ppo")
    with pytest.raises(ValueError, match="needs the reference"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), _loss("grpo", kl_coef=0.1))


def _slime_case(case: dict, inputs: dict, monkeypatch) -> tuple[float, list[list[float]]]:
    """slime's ``loss_function`` on the case's tensors: one rank, the log-probs handed in as its 'logits'."""
    from argparse import Namespace

    from megatron.core import mpu
    from slime.backends.megatron_utils import loss as slime_loss

    monkeypatch.setattr(mpu, "get_context_parallel_world_size", lambda: 1)
    monkeypatch.setattr(mpu, "get_data_parallel_world_size", lambda with_context_parallel=False: 1)

    def given_log_probs(logits, args, unconcat_tokens, total_lengths, response_lengths, with_entropy=False, **kw):
        out = {"log_probs": list(logits.split(response_lengths, dim=0))}
        if with_entropy:
            out["entropy"] = [torch.zeros_like(x) for x in out["log_probs"]]
        return None, out

    monkeypatch.setattr(slime_loss, "get_log_probs_and_entropy", given_log_probs)
    s, lengths, masks = case["settings"], inputs["response_lengths"], inputs["loss_masks"]
    args = Namespace(
        **s, use_rollout_logprobs=False, use_opsm=False, eps_clip_c=None, get_mismatch_metrics=False, use_tis=False,
        custom_pg_loss_reducer_function_path=None, use_unbiased_kl=False, rollout_top_p=1.0,
        recompute_loss_function=False, allgather_cp=False,
    )  # fmt: skip
    logits = torch.tensor([x for row in inputs["log_probs"] for x in row], requires_grad=True)
    batch = {
        "advantages": [torch.full((n,), a) for n, a in zip(lengths, inputs["advantages"], strict=True)],
        "log_probs": [torch.tensor(x) for x in inputs["old_log_probs"]],
        "ref_log_probs": [torch.tensor(x) for x in inputs["ref_log_probs"]],
        "loss_masks": [torch.tensor(m, dtype=torch.float32) for m in masks],
        "rollout_mask_sums": [torch.tensor(float(sum(m))) for m in masks],  # one sample a rollout
        "response_lengths": lengths, "total_lengths": [n + 4 for n in lengths], "unconcat_tokens": [None] * len(lengths),
    }  # fmt: skip
    loss, normalizer, _ = slime_loss.loss_function(args, batch, 1, len(lengths), logits)
    final = loss / normalizer
    final.backward()
    return float(final), [g.tolist() for g in logits.grad.split(lengths)]


@pytest.mark.slime
@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: f"{c['group']}-per_token={c['settings']['calculate_per_token_loss']}")
def test_the_stored_case_is_what_slime_computes_now(case, monkeypatch):
    loss, grad = _slime_case(case, INPUTS, monkeypatch)
    assert loss == pytest.approx(case["expected"]["loss"], rel=1e-5, abs=1e-7)
    assert local_loss(case, INPUTS)[0] == pytest.approx(loss, rel=1e-5, abs=1e-7)
    for mine, slimes in zip(grad, case["expected"]["grad"], strict=True):
        assert mine == pytest.approx(slimes, rel=1e-4, abs=1e-7)
