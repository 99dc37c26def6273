"""Adapter-only checkpoints: save, reload into fresh objects, continue; never the backbone; atomic.

Megatron's real DDP, optimizer (Adam, the non-distributed one: the distributed optimizer needs CUDA),
LR scheduler and dist-checkpointing, on CPU.
"""

from __future__ import annotations

import re

import pytest
import torch

from aclarena_slime.lora import LoraConfig, inject_lora
from aclarena_slime.lora import checkpoint as ckpt
from aclarena_slime.lora.megatron_train import build_training, megatron_training_on_cpu, train_step
from aclarena_slime.lora.selftest import TinyQwen3, build_tiny_gpt

SHAPE = TinyQwen3(num_layers=2)
IDS = torch.randint(0, SHAPE.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))


def _fresh():
    """What a restarted trainer builds: the backbone (same seed: what --load gives), a fresh adapter."""
    model = build_tiny_gpt(SHAPE, seed=0, recompute="full")
    inject_lora(model, LoraConfig(rank=4, alpha=8))
    return build_training(model, lr=1e-2)


def _adapter(ddp) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in ddp.named_parameters() if ".lora_" in n}


def _moments(optimizer) -> list[torch.Tensor]:
    """Adam's state, parameter by parameter in the optimizer's own order."""
    out = []
    for inner in optimizer.chained_optimizers:
        for group in inner.optimizer.param_groups:
            for param in group["params"]:
                state = inner.optimizer.state[param]
                out.extend(state[k].clone() for k in sorted(state) if torch.is_tensor(state[k]))
    return out


def test_resume_continues_exactly(tp1, tmp_path):
    root = tmp_path / "lora_adapter"
    with megatron_training_on_cpu():
        ddp, optimizer, scheduler = _fresh()
        backbone = {n: p.detach().clone() for n, p in ddp.named_parameters() if ".lora_" not in n}
        losses = [train_step(ddp, optimizer, scheduler, IDS)[0] for _ in range(2)]
        ckpt.save_adapter_checkpoint(root, 2, [ddp], optimizer, scheduler)
        saved_adapter, saved_moments, saved_lr = (
            _adapter(ddp),
            _moments(optimizer),
            scheduler.get_lr(optimizer.param_groups[0]),
        )
        expected_next = train_step(ddp, optimizer, scheduler, IDS)[0]
        after_adapter = _adapter(ddp)

        ddp2, optimizer2, scheduler2 = _fresh()  # the process died; a new one starts
        assert not all(torch.equal(a, b) for a, b in zip(_adapter(ddp2).values(), saved_adapter.values(), strict=True))
        assert ckpt.load_adapter_checkpoint(root, [ddp2], optimizer2, scheduler2) == 2
        assert all(torch.equal(_adapter(ddp2)[k], v) for k, v in saved_adapter.items())
        assert all(torch.equal(a, b) for a, b in zip(_moments(optimizer2), saved_moments, strict=True))
        assert saved_moments and scheduler2.num_steps == 2
        assert scheduler2.get_lr(optimizer2.param_groups[0]) == saved_lr
        assert train_step(ddp2, optimizer2, scheduler2, IDS)[0] == expected_next
        assert all(torch.equal(_adapter(ddp2)[k], v) for k, v in after_adapter.items())
    assert losses[1] < losses[0]
    assert all(torch.equal(p, backbone[n]) for n, p in ddp2.named_parameters() if ".lora_" not in n)


def test_only_the_adapter_is_written(tp1, tmp_path):
    from megatron.core.dist_checkpointing import load_tensors_metadata

    with megatron_training_on_cpu():
        ddp, optimizer, scheduler = _fresh()
        train_step(ddp, optimizer, scheduler, IDS)
        path = ckpt.save_adapter_checkpoint(tmp_path, 1, [ddp], optimizer, scheduler)
    keys = set(load_tensors_metadata(str(path)))
    assert keys and all(".lora_" in k for k in keys), sorted(k for k in keys if ".lora_" not in k)
    assert any(k.startswith("optimizer.") and "exp_avg_sq" in k for k in keys)
    # Megatron stacks the layers of one tensor name into one checkpoint key (decoder.layers.<name>).
    per_layer = {re.sub(r"layers\.\d+\.", "layers.", n) for n, _ in ddp.named_parameters() if ".lora_" in n}
    assert {k for k in keys if not k.startswith("optimizer.")} == per_layer


def test_a_crashed_save_never_replaces_the_good_one(tp1, tmp_path, monkeypatch):
    from megatron.core import dist_checkpointing

    with megatron_training_on_cpu():
        ddp, optimizer, scheduler = _fresh()
        train_step(ddp, optimizer, scheduler, IDS)
        ckpt.save_adapter_checkpoint(tmp_path, 1, [ddp], optimizer, scheduler)
        good = _adapter(ddp)
        train_step(ddp, optimizer, scheduler, IDS)
        real_save = dist_checkpointing.save

        def dies_half_way(state, directory, **kwargs):
            (tmp_path / "marker").write_text("partial files were written")
            (__import__("pathlib").Path(directory) / "__0_0.distcp").write_bytes(b"half")
            raise KeyboardInterrupt("killed during the save")

        monkeypatch.setattr(dist_checkpointing, "save", dies_half_way)
        with pytest.raises(KeyboardInterrupt):
            ckpt.save_adapter_checkpoint(tmp_path, 2, [ddp], optimizer, scheduler)
        assert ckpt.latest_iteration(tmp_path) == 1 and (tmp_path / ".iter_0000002.partial").exists()
        ddp2, optimizer2, scheduler2 = _fresh()
        assert ckpt.load_adapter_checkpoint(tmp_path, [ddp2], optimizer2, scheduler2) == 1
        assert all(torch.equal(_adapter(ddp2)[k], v) for k, v in good.items())
        monkeypatch.setattr(dist_checkpointing, "save", real_save)
        ckpt.save_adapter_checkpoint(tmp_path, 2, [ddp], optimizer, scheduler)  # the next save cleans up
    assert ckpt.latest_iteration(tmp_path) == 2 and not (tmp_path / ".iter_0000002.partial").exists()


def test_no_checkpoint_means_a_fresh_adapter(tp1, tmp_path):
    with megatron_training_on_cpu():
        ddp, optimizer, scheduler = _fresh()
        assert ckpt.load_adapter_checkpoint(tmp_path / "missing", [ddp], optimizer, scheduler) is None


def test_a_tracker_naming_a_missing_checkpoint_is_an_error(tmp_path):
    (tmp_path / "latest").write_text("7\n")
    with pytest.raises(RuntimeError, match="not a finished checkpoint"):
        ckpt.latest_iteration(tmp_path)


def test_the_patched_loader_starts_a_fresh_stage_at_rollout_0_and_a_resumed_one_after_its_adapter(tp1, tmp_path):
    """slime starts at ``loaded iteration + 1`` (slime/backends/megatron_utils/actor.py) unless --start-rollout-id is
    given; a backbone loaded with --finetune answers iteration 0 (Megatron, and slime's HF loader literally), so a
    fresh LoRA stage used to start at rollout 1 and skip rollout 0's eval."""
    from types import SimpleNamespace

    slime_model = SimpleNamespace(save_checkpoint=None, load_checkpoint=lambda *a, **k: (0, 0))
    ckpt.install(slime_model, str(tmp_path))
    with megatron_training_on_cpu():
        ddp, optimizer, scheduler = _fresh()
        loaded, _ = slime_model.load_checkpoint([ddp], optimizer, scheduler)
        assert loaded + 1 == 0
        train_step(ddp, optimizer, scheduler, IDS)
        slime_model.save_checkpoint(4, [ddp], optimizer, scheduler)  # slime saves at rollout id 4
        ddp2, optimizer2, scheduler2 = _fresh()
        loaded, _ = slime_model.load_checkpoint([ddp2], optimizer2, scheduler2)
    assert loaded + 1 == 5


def test_a_save_killed_between_its_two_renames_is_recovered(tp1, tmp_path, monkeypatch):
    """Saving an iteration again renames ``iter_N`` to ``.iter_N.old``, then the new one in: killed between the
    two, ``latest`` names a missing folder. The load finds the data in ``.iter_N.old``; the next save puts it
    back and clears what the killed save left."""
    import os

    with megatron_training_on_cpu():
        ddp, optimizer, scheduler = _fresh()
        train_step(ddp, optimizer, scheduler, IDS)
        ckpt.save_adapter_checkpoint(tmp_path, 1, [ddp], optimizer, scheduler)
        good = _adapter(ddp)
        real_rename = os.rename

        def dies_after_the_first(src, dst):
            real_rename(src, dst)
            if str(dst).endswith(".old"):
                raise KeyboardInterrupt("killed between the renames")

        monkeypatch.setattr(ckpt.os, "rename", dies_after_the_first)
        train_step(ddp, optimizer, scheduler, IDS)
        with pytest.raises(KeyboardInterrupt):
            ckpt.save_adapter_checkpoint(tmp_path, 1, [ddp], optimizer, scheduler)
        monkeypatch.setattr(ckpt.os, "rename", real_rename)
        assert not (tmp_path / "iter_0000001").exists() and (tmp_path / ".iter_0000001.old").is_dir()
        assert ckpt.latest_iteration(tmp_path) == 1
        ddp2, optimizer2, scheduler2 = _fresh()
        assert ckpt.load_adapter_checkpoint(tmp_path, [ddp2], optimizer2, scheduler2) == 1
        assert all(torch.equal(_adapter(ddp2)[k], v) for k, v in good.items())
        (tmp_path / ".latest.tmp-99999").write_text("1\n")  # a tracker write killed before its replace
        ckpt.save_adapter_checkpoint(tmp_path, 2, [ddp2], optimizer2, scheduler2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000001", "iter_0000002", "latest"]


def test_a_tracker_naming_a_missing_checkpoint_says_what_is_there(tmp_path):
    (tmp_path / "latest").write_text("7\n")
    (tmp_path / ".iter_0000007.partial").mkdir()
    with pytest.raises(RuntimeError, match=r"not a finished checkpoint.*iter_0000007 is missing.*\.iter_0000007\.partial"):
        ckpt.latest_iteration(tmp_path)
