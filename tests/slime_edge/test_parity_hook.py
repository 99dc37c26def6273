"""The train-side parity hook on slime's rollout_data shapes (slime's CP slicer stood in: CP 1, no slime here)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from aclarena_slime import parity
from aclarena_slime.slime_edge import parity as hook


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(hook, "_checked", False)
    # slime.backends.megatron_utils.cp_utils.slice_log_prob_with_cp returns its input at CP size 1.
    cp_utils = types.ModuleType("slime.backends.megatron_utils.cp_utils")
    cp_utils.slice_log_prob_with_cp = lambda values, total, response: values
    for name in ("slime", "slime.backends", "slime.backends.megatron_utils"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, cp_utils.__name__, cp_utils)


def _data(gap: float) -> dict:
    engine = [torch.tensor([-0.5, 0.0, -1.25]), torch.tensor([-2.0])]
    return {
        "rollout_log_probs": engine,
        "log_probs": [engine[0] + gap, engine[1] + gap],
        "loss_masks": [torch.tensor([1, 0, 1], dtype=torch.int), torch.tensor([1], dtype=torch.int)],
        "total_lengths": [7, 5],
        "response_lengths": [3, 1],
    }


def test_first_batch_within_tolerance_passes_and_later_batches_are_not_rechecked(capsys):
    args = types.SimpleNamespace()
    hook.check_first_batch(args, 0, _data(0.01))
    assert "parity ok" in capsys.readouterr().out
    hook.check_first_batch(args, 1, _data(5.0))  # checked once per process: the first batch


def test_a_gap_above_the_tolerance_stops_the_job():
    with pytest.raises(parity.ParityError, match="3 tokens"):
        hook.check_first_batch(types.SimpleNamespace(), 0, _data(0.2))
    ok = types.SimpleNamespace(aclarena_parity_tolerance=0.25)
    hook._checked = False
    hook.check_first_batch(ok, 0, _data(0.2))


def test_without_a_recompute_it_says_it_checked_nothing(capsys):
    data = _data(0.0)
    del data["log_probs"]  # slime reused the loss's forward (one optimiser step per rollout)
    hook.check_first_batch(types.SimpleNamespace(), 0, data)
    assert "parity not checked" in capsys.readouterr().out
