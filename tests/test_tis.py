"""The authors' mismatch correction (truncated IS weights, a rejection band, a sequence veto, batch
normalisation) on tensors, and inside real slime's policy loss (marker ``slime``)."""

from __future__ import annotations

import math
from argparse import Namespace

import pytest
import torch

from aclarena_slime.slime_edge import custom
from aclarena_slime.slime_edge.tis import mismatch_tis
from aclarena_slime.tis import TisConfigError, TisSettings, correction


def _t(values):
    return torch.tensor(values, dtype=torch.float32)


def _log(ratios):
    return _t([math.log(r) for r in ratios])


def test_truncate_reject_and_normalise_token_by_token():
    ratios = [1.0, 3.0, 0.4, 1.5]  # kept, truncated at 2 and rejected, rejected below 0.5, kept
    weights, masks, metrics = correction([_log(ratios)], [_t([0.0] * 4)], [_t([1, 1, 1, 1])], TisSettings())
    raw = [1.0, 2.0, 0.4, 1.5]
    mean = sum(raw) / 4
    assert weights[0].tolist() == pytest.approx([r / mean for r in raw])
    assert masks[0].tolist() == [1, 0, 0, 1]
    assert metrics["truncated"][0].tolist() == [0, 1, 0, 0]
    assert metrics["rejected"][0].tolist() == [0, 1, 1, 0]
    assert metrics["batch_norm_factor"][0].tolist() == pytest.approx([mean] * 4)


def test_one_catastrophic_token_vetoes_its_sequence_only():
    bad = [1.0, 1e-5, 1.0]  # below the 1e-4 veto
    good = [1.0, 1.1]
    _, masks, metrics = correction(
        [_log(bad), _log(good)], [_t([0.0] * 3), _t([0.0] * 2)], [_t([1, 1, 1]), _t([1, 1])], TisSettings()
    )
    assert masks[0].tolist() == [0, 0, 0] and masks[1].tolist() == [1, 1]
    assert metrics["vetoed"][0].tolist() == [1, 1, 1] and metrics["vetoed"][1].tolist() == [0, 0]


def test_masked_tokens_never_count():
    """Observation tokens (mask 0, rollout log-prob 0.0) enter no weight, rejection, veto or normaliser."""
    train = _t([-1.0, -30.0, -1.0])  # the middle one would be vetoed and rejected if it counted
    rollout = _t([-1.0, 0.0, -1.0])
    weights, masks, metrics = correction([train], [rollout], [_t([1, 0, 1])], TisSettings())
    assert masks[0].tolist() == [1, 0, 1]
    assert weights[0].tolist() == [1.0, 0.0, 1.0]
    assert metrics["vetoed"][0].sum() == 0 and metrics["rejected"][0].sum() == 0


def test_without_normalisation_weights_are_the_capped_ratios():
    settings = TisSettings(cap=4.0, reject_below=None, reject_above=None, veto_below=None, batch_normalize=False)
    weights, masks, _ = correction([_log([0.1, 5.0, 2.0])], [_t([0.0] * 3)], [_t([1, 1, 1])], settings)
    assert weights[0].tolist() == pytest.approx([0.1, 4.0, 2.0])
    assert masks[0].tolist() == [1, 1, 1]


def test_slime_adapter_reweights_pg_loss_and_reports_flat_metrics():
    args = Namespace(aclarena_tis={"batch_normalize": False}, context_parallel_size=1)
    pg_loss = torch.ones(5)
    out, masks, metrics = mismatch_tis(
        args,
        pg_loss=pg_loss,
        train_log_probs=[_log([1.0, 3.0]), _log([1.0, 1.0, 0.6])],
        rollout_log_probs=[_t([0.0] * 2), _t([0.0] * 3)],
        loss_masks=[_t([1, 1]), _t([1, 1, 1])],
        total_lengths=[6, 8],
        response_lengths=[2, 3],
    )
    assert out.tolist() == pytest.approx([1.0, 2.0, 1.0, 1.0, 0.6])
    assert [m.tolist() for m in masks] == [[1, 0], [1, 1, 1]]
    assert all(key.startswith("mis_") and value.shape == (5,) for key, value in metrics.items())


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="unknown aclarena_tis keys"):
        custom.tis(Namespace(aclarena_tis={"upper": 2.0}))
    with pytest.raises(TisConfigError, match="reject_below < reject_above"):
        custom.tis(Namespace(aclarena_tis={"reject_below": 2.0, "reject_above": 0.5}))
    with pytest.raises(ValueError, match="one of each per sequence"):
        correction([_t([0.0])], [], [_t([1])], TisSettings())


@pytest.fixture
def megatron_single_rank():
    """A one-process gloo group with Megatron's parallel state: what slime's loss reads on CPU."""
    import os

    import torch.distributed as dist
    from megatron.core import parallel_state

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.mark.slime
def test_inside_real_slime_policy_loss_a_vetoed_sequence_gets_no_gradient(megatron_single_rank):
    """slime's own ``policy_loss_function`` loads ``--custom-tis-function-path aclarena_slime.slime_edge.tis.mismatch_tis``."""
    from slime.backends.megatron_utils.cp_utils import get_sum_of_sample_mean
    from slime.backends.megatron_utils.loss import policy_loss_function

    args = Namespace(
        use_opsm=False, advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=None,
        get_mismatch_metrics=False, use_tis=True, custom_tis_function_path="aclarena_slime.slime_edge.tis.mismatch_tis",
        calculate_per_token_loss=False, custom_pg_loss_reducer_function_path=None, entropy_coef=0.0,
        use_kl_loss=False, use_unbiased_kl=False, kl_loss_type="low_var_kl", kl_loss_coef=0.0,
        use_rollout_logprobs=False, rollout_temperature=1.0, allgather_cp=False, log_probs_chunk_size=-1,
        rollout_top_p=1.0, tis_clip=2.0, tis_clip_low=0.0, context_parallel_size=1,
    )  # fmt: skip
    vocab, total, response = 11, [7, 9], [4, 5]
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, vocab, (n,), generator=gen) for n in total]
    logits = torch.randn(1, sum(total), vocab, generator=gen)
    train = []  # the training engine's log-probs of each response token, as slime computes them
    offset = 0
    for seq, n, r in zip(tokens, total, response, strict=True):
        rows = torch.log_softmax(logits[0, offset + n - r - 1 : offset + n - 1], dim=-1)
        train.append(rows.gather(-1, seq[n - r :].unsqueeze(-1)).squeeze(-1))
        offset += n
    rollout = [train[0].clone(), train[1].clone()]
    rollout[1][2] += 10.0  # one token of sequence 2 is e^-10 as likely under training: vetoed
    masks = [_t([1, 1, 0, 1]), _t([1, 1, 1, 1, 1])]
    batch = dict(
        advantages=[torch.ones(4), -torch.ones(5)], log_probs=None, rollout_log_probs=rollout,
        unconcat_tokens=tokens, response_lengths=response, total_lengths=total, loss_masks=masks,
        rollout_mask_sums=[m.sum() for m in masks],
    )  # fmt: skip
    logits.requires_grad_(True)
    loss, metrics = policy_loss_function(args, batch, logits, get_sum_of_sample_mean(total, response, masks))
    loss.backward()
    assert logits.grad[0, : total[0]].abs().sum() > 0
    assert logits.grad[0, total[0] :].abs().sum() == 0, "the vetoed sequence must not move the policy"
    assert float(metrics["mis_vetoed"]) > 0 and "mis_batch_norm_factor" in metrics
