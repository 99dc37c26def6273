"""Adapter-only checkpoints for a LoRA stage: the adapter and its optimizer state, never the backbone.

Slime saves through Megatron's ``save_checkpoint`` (the whole model and optimizer; for a LoRA stage
that is the frozen backbone again at every save) and loads through ``load_checkpoint`` from
``--load``, which for a LoRA stage is the backbone it started from, so a rerun after a crash started
the adapter from scratch. :func:`install` (called by ``provider.megatron_init``) replaces both names in
slime's ``backends/megatron_utils/model.py``, the module whose ``save`` and
``initialize_model_and_optimizer`` call them:

- save: :func:`save_adapter_checkpoint` writes ``<--save>/lora_adapter/iter_<N>`` with Megatron's
  dist-checkpointing (``dist_checkpointing.save``), restricted to the adapter's sharded tensors and
  ``optimizer.sharded_state_dict`` of them (the optimizer only holds the adapters), plus the LR
  scheduler and the iteration. Slime's own ``save`` still wraps the call (forward pre-hooks off, so
  the distributed optimizer's parameter gather finishes first).
- load: Megatron loads the backbone from ``--load`` as before; then, when ``<--save>/lora_adapter``
  holds a finished checkpoint, the adapter, the optimizer and the scheduler are loaded from it and its
  iteration is returned, so slime's next rollout id follows it; without one, -1 (slime starts at rollout 0).

Atomic: every rank writes into ``.iter_<N>.partial``; after a barrier, rank 0 renames it to
``iter_<N>`` and only then replaces the tracker file ``latest`` (write, fsync, ``os.replace``). A crash
at any point leaves the tracker on the previous good checkpoint. Saving an iteration again moves the
old one to ``.iter_<N>.old`` first; a crash between that rename and the next leaves the tracker's
checkpoint there, where the load finds it. Each save's writer first tidies what killed saves left:
an ``.old`` whose ``iter_<N>`` is missing is put back, other ``.old`` and ``.partial`` folders and
half-written tracker files are removed. Dist-checkpointing reshards, so a
resume may use another TP / DP layout. Not kept: RNG states (LoRA stages run without dropout). Slime's
data source saves its prompt position under ``--save`` and reads it from ``--load`` (the backbone
folder); :mod:`aclarena_slime.slime_edge.data_source` reads it from ``--save`` when this stage resumes.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)
ADAPTER_CHECKPOINT_DIR = "lora_adapter"
TRACKER = "latest"
_ADAPTER_MARK = ".lora_"


def adapter_checkpoint_root(save_dir: str | os.PathLike) -> Path:
    """Where a stage whose ``--save`` is ``save_dir`` keeps its adapter checkpoints."""
    return Path(save_dir) / ADAPTER_CHECKPOINT_DIR


def latest_iteration(root: str | os.PathLike) -> int | None:
    """The iteration of the last finished adapter checkpoint under ``root``, or None."""
    tracker = Path(root) / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise RuntimeError(f"{tracker} names {text!r}, which is not a finished checkpoint under {root}")
    checkpoint_dir(root, int(text))
    return int(text)


def checkpoint_dir(root: str | os.PathLike, iteration: int) -> Path:
    """The folder holding iteration ``iteration``: ``iter_<N>``, or ``.iter_<N>.old`` where a save of the
    same iteration was killed between its two renames (the data the tracker was written for is there)."""
    root = Path(root)
    final = root / _iteration_dir(iteration)
    if final.is_dir():
        return final
    old = root / f".{final.name}.old"
    if old.is_dir():
        logger.warning("%s is missing (a save was killed between its renames): the checkpoint is read from %s",
                       final, old)
        return old
    present = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    raise RuntimeError(
        f"{root / TRACKER} names {iteration}, which is not a finished checkpoint under {root}: {final.name} is "
        f"missing and there is no {old.name} to recover from (present: {', '.join(present) or 'nothing'})"
    )


def _iteration_dir(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def _tidy(root: Path) -> None:
    """Undo what killed saves left (the writer, before a save): an ``.old`` whose ``iter_<N>`` is missing goes
    back in its place; other ``.old`` and all ``.partial`` folders and tracker temp files are removed."""
    for path in sorted(root.iterdir()):
        name = path.name
        if name.startswith(".iter_") and name.endswith(".old"):
            final = root / name[1 : -len(".old")]
            if final.exists():
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.rename(path, final)
                logger.warning("LoRA adapter checkpoint %s recovered from %s (a save was killed)", final, path)
        elif name.startswith(".iter_") and name.endswith(".partial"):
            shutil.rmtree(path, ignore_errors=True)
        elif name.startswith(f".{TRACKER}.tmp-"):
            path.unlink(missing_ok=True)


def _chunk_key(index: int, count: int) -> str:
    return "model" if count == 1 else f"model{index}"  # Megatron's names for model chunks


def adapter_sharded_state_dict(model: Sequence[nn.Module]) -> dict[str, dict[str, Any]]:
    """Each model chunk's sharded state dict restricted to the adapters (Megatron's chunk keys)."""
    out: dict[str, dict[str, Any]] = {}
    for index, chunk in enumerate(model):
        state = {k: v for k, v in chunk.sharded_state_dict().items() if _ADAPTER_MARK in k}
        if not state:
            raise RuntimeError("no adapter tensors in the model's sharded state dict: is LoRA injected?")
        out[_chunk_key(index, len(model))] = state
    return out


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _is_writer() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def _write_tracker(root: Path, iteration: int) -> None:
    staging = root / f".{TRACKER}.tmp-{os.getpid()}"
    with open(staging, "w") as handle:
        handle.write(f"{iteration}\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(staging, root / TRACKER)
    directory = os.open(root, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def save_adapter_checkpoint(
    root: str | os.PathLike, iteration: int, model: Sequence[nn.Module], optimizer: Any, scheduler: Any = None
) -> Path:
    """Write the adapter, its optimizer state and the scheduler as ``root/iter_<iteration>``; every rank calls it.

    ``optimizer`` is a Megatron optimizer (``sharded_state_dict`` / ``load_state_dict``), or None.
    """
    from megatron.core import dist_checkpointing

    root = Path(root)
    final = root / _iteration_dir(iteration)
    partial = root / f".{final.name}.partial"
    if _is_writer():
        root.mkdir(parents=True, exist_ok=True)
        _tidy(root)  # left by saves that were killed
        partial.mkdir()
    _barrier()
    state: dict[str, Any] = adapter_sharded_state_dict(model)
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(dict(state))
    state["scheduler"] = scheduler.state_dict() if scheduler is not None else None
    state["iteration"] = iteration
    dist_checkpointing.save(state, str(partial))
    _barrier()
    if _is_writer():
        if final.exists():  # the same iteration saved again: the tracker may point at it, so swap carefully
            old = root / f".{final.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
            os.rename(partial, final)
            shutil.rmtree(old)
        else:
            os.rename(partial, final)
        _write_tracker(root, iteration)
        logger.info("LoRA adapter checkpoint %s written", final)
    _barrier()
    return final


def load_adapter_checkpoint(
    root: str | os.PathLike, model: Sequence[nn.Module], optimizer: Any, scheduler: Any = None
) -> int | None:
    """Load the latest adapter checkpoint under ``root`` into the model (and optimizer, scheduler).

    Returns its iteration, or None when ``root`` holds none (the adapter keeps its fresh values).
    """
    from megatron.core import dist_checkpointing

    iteration = latest_iteration(root)
    if iteration is None:
        return None
    path = checkpoint_dir(root, iteration)
    model_state = adapter_sharded_state_dict(model)
    state: dict[str, Any] = dict(model_state)
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(dict(model_state), is_loading=True)
    loaded = dist_checkpointing.load(state, str(path))
    with torch.no_grad():
        for chunk_key, entries in model_state.items():
            for key, entry in entries.items():  # a ShardedTensor (or factory) whose data is the parameter
                if key not in loaded[chunk_key]:
                    raise RuntimeError(f"{path}: adapter tensor {key} is missing")
                value = loaded[chunk_key][key]
                if value.data_ptr() != entry.data.data_ptr():  # loaded elsewhere (e.g. a merged GLU factory)
                    entry.data.copy_(value)
    if optimizer is not None:
        optimizer.load_state_dict(loaded["optimizer"])
    if scheduler is not None and loaded.get("scheduler") is not None:
        scheduler.load_state_dict(loaded["scheduler"])
    if int(loaded["iteration"]) != iteration:
        raise RuntimeError(f"{path} holds iteration {loaded['iteration']}, its tracker says {iteration}")
    logger.info("LoRA adapter and optimizer state resumed from %s", path)
    return iteration


def install(slime_model_module: Any, save_dir: str | None) -> None:
    """Point slime's ``save_checkpoint`` / ``load_checkpoint`` (in ``slime_model_module``) at the adapter.

    Idempotent; ``save_dir`` is ``args.save`` (no ``--save``: nothing is saved, nothing resumed).
    """
    originals = getattr(slime_model_module, "_aclarena_lora_originals", None)
    if originals is None:
        originals = (slime_model_module.save_checkpoint, slime_model_module.load_checkpoint)
        slime_model_module._aclarena_lora_originals = originals
    load_backbone = originals[1]
    root = adapter_checkpoint_root(save_dir) if save_dir else None

    def save_checkpoint(iteration, model, optimizer, opt_param_scheduler, *args, **kwargs) -> None:
        if root is None:
            raise RuntimeError("a LoRA stage saves its adapter under --save; set checkpoint.save")
        save_adapter_checkpoint(root, iteration, model, optimizer, opt_param_scheduler)

    def load_checkpoint(model, optimizer, opt_param_scheduler, *args, **kwargs):
        _, flops = load_backbone(model, optimizer, opt_param_scheduler, *args, **kwargs)
        resumed = load_adapter_checkpoint(root, model, optimizer, opt_param_scheduler) if root else None
        # slime starts at the returned iteration + 1 (slime/backends/megatron_utils/actor.py): the backbone's
        # iteration (0 under --finetune) would skip rollout 0; -1 starts a fresh stage at 0.
        return (-1, flops) if resumed is None else (resumed, 0)

    slime_model_module.save_checkpoint = save_checkpoint
    slime_model_module.load_checkpoint = load_checkpoint
