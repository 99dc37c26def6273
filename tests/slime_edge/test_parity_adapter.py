"""The parity check sees the adapter (issue 44, section 2): a stage whose exported q/k/v split is wrong is
stopped at the first rollout served from a trained adapter.

Real pieces on CPU: a tiny Qwen3-shaped megatron-core GPT with our LoRA layers (the trainer), one Adam
step on its adapter, the real export (``lora.export.export_peft``) into a PEFT folder, and transformers'
Qwen3 + PEFT reading that folder (the engine's log-probs). The wrong split is a plain [q; k; v] cut of
Megatron's per-group interleaved ``linear_qkv`` rows. At rollout 0 B is zero, so both exports serve
exactly the backbone and the gap is 0; after one step the wrong export's gap is ~0.05 while the right
one stays at 0, and the slime hook sequence (``on_rollout`` then ``check_in_loss``) must tell them apart.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import asdict
from unittest import mock

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core (the 'megatron' extra) is not installed")

from aclarena_slime import parity  # noqa: E402
from aclarena_slime.lora import export  # noqa: E402
from aclarena_slime.lora.config import LoraConfig  # noqa: E402
from aclarena_slime.lora.layers import inject_lora  # noqa: E402
from aclarena_slime.lora.selftest import (  # noqa: E402
    TinyQwen3,
    build_tiny_gpt,
    hf_peft_logits,
    megatron_logits,
    model_parallel,
    save_hf_backbone,
)
from aclarena_slime.slime_edge import parity as hook  # noqa: E402

RESPONSE = 6


def plain_qkv_split(fused: torch.Tensor, shape: export.AttentionShape):
    """The bug: q, k, v cut as three contiguous blocks, ignoring Megatron's per-query-group interleave."""
    q_rows = shape.num_attention_heads * shape.head_dim
    kv_rows = shape.num_query_groups * shape.head_dim
    return fused.split([q_rows, kv_rows, kv_rows], dim=0)


def _response_log_probs(logits: torch.Tensor, ids: torch.Tensor) -> list[torch.Tensor]:
    rows = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return [row[-RESPONSE:] for row in rows]


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    """Per rollout (0: fresh adapter, 1: after one Adam step): trainer log-probs and the engine's through the
    right and the wrong export."""
    out = tmp_path_factory.mktemp("parity-adapter")
    shape = TinyQwen3()
    config = LoraConfig(rank=4, alpha=8.0, adapter_name="math")
    ids = torch.randint(0, shape.vocab_size, (4, 12), generator=torch.Generator().manual_seed(0))
    found = []
    with model_parallel():
        model = build_tiny_gpt(shape, seed=0)
        inject_lora(model, config)
        save_hf_backbone(model, shape, out / "backbone")
        adapters = [p for name, p in model.named_parameters() if "lora_" in name]
        for p in model.parameters():
            p.requires_grad_(any(p is a for a in adapters))
        optimiser = torch.optim.Adam(adapters, lr=1e-2)
        for rollout in range(2):
            model.eval()
            with torch.no_grad():
                trainer = _response_log_probs(megatron_logits(model, ids), ids)
            engines = {}
            for kind in ("right", "wrong"):
                folder = out / f"rollout{rollout}-{kind}"
                split = plain_qkv_split if kind == "wrong" else export.split_qkv_rows
                with mock.patch.object(export, "split_qkv_rows", split):
                    export.export_peft(model, folder, config, base_model=str(out / "backbone"))
                engines[kind] = _response_log_probs(hf_peft_logits(out / "backbone", folder, ids), ids)
            found.append((trainer, engines))
            model.train()  # the rollout's update: one optimiser step on the adapter
            loss = -torch.stack(_response_log_probs(megatron_logits(model, ids), ids)).mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    return found


def _train_rollout(args: Namespace, rollout: int, trainer, engine) -> None:
    """What slime does per rollout with one optimiser step: the rollout-data hook, then the loss's TIS call."""
    hook.on_rollout(args, rollout, {"rollout_log_probs": engine})  # no separate recompute: no "log_probs"
    masks = [torch.ones(RESPONSE, dtype=torch.int) for _ in trainer]
    hook.check_in_loss(args, pg_loss=torch.zeros(1), train_log_probs=trainer, rollout_log_probs=engine,
                       loss_masks=masks, total_lengths=[12] * len(trainer), response_lengths=[RESPONSE] * len(trainer))  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(hook, "_state", hook._State())


@pytest.mark.slow
def test_a_wrong_qkv_split_is_invisible_at_rollout_0_and_stops_the_stage_at_rollout_1(rollouts):
    args = Namespace(context_parallel_size=1, aclarena_parity=asdict(parity.ParitySettings()))
    (trainer0, engines0), (trainer1, engines1) = rollouts
    assert torch.equal(torch.stack(engines0["right"]), torch.stack(engines0["wrong"])), "B = 0: the split is moot"
    _train_rollout(args, 0, trainer0, engines0["wrong"])  # calibrates: the gap of the base path
    with pytest.raises(parity.ParityError, match=r"rollout 1.*FAILED.*calibrated on 0") as stopped:
        _train_rollout(args, 1, trainer1, engines1["wrong"])
    assert len(hook._state.lines) == 1 and "calibrating" in hook._state.lines[0]
    gap = float(str(stopped.value).split("mean |gap| ")[1].split(" ")[0])
    assert gap > 10 * parity.ParitySettings().floor


@pytest.mark.slow
def test_the_right_split_passes_every_rollout_and_logs_each_gap(rollouts, capsys):
    args = Namespace(context_parallel_size=1, aclarena_parity=asdict(parity.ParitySettings()))
    for rollout, (trainer, engines) in enumerate(rollouts):
        _train_rollout(args, rollout, trainer, engines["right"])
        hook.check_in_loss(args, pg_loss=torch.zeros(1), train_log_probs=[t + 9 for t in trainer],
                           rollout_log_probs=engines["right"], loss_masks=[torch.ones(RESPONSE)] * len(trainer),
                           total_lengths=[12] * len(trainer), response_lengths=[RESPONSE] * len(trainer))  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.count("log-prob parity ok") == 2  # one line a rollout; later micro-batches train on
    assert "rollout 0, first micro-batch" in printed and "rollout 1, first micro-batch" in printed
