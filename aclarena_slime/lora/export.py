"""Megatron LoRA adapter -> Hugging Face PEFT directory (the expert interchange format).

Megatron fuses q/k/v into ``linear_qkv`` (rows interleaved per query group:
``[q (heads_per_group x head_dim), k (head_dim), v (head_dim)] x groups``) and gate/up into
``linear_fc1`` (``[gate; up]``). PEFT and SGLang want the separate HF projections, so B is split
accordingly while the shared A is copied to each part (the product B·A is unchanged).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save as save_safetensors
from torch import nn

from .config import LoraConfig
from .layers import lora_modules

PEFT_PREFIX = "base_model.model.model.layers"
_HF_PARENT = {"linear_qkv": "self_attn", "linear_proj": "self_attn", "linear_fc1": "mlp", "linear_fc2": "mlp"}


@dataclass(frozen=True)
class AttentionShape:
    """What de-interleaving ``linear_qkv`` needs to know."""

    num_attention_heads: int
    num_query_groups: int
    head_dim: int

    @classmethod
    def from_megatron(cls, config) -> AttentionShape:
        return cls(
            config.num_attention_heads, config.num_query_groups or config.num_attention_heads, config.kv_channels
        )


def split_qkv_rows(fused: torch.Tensor, shape: AttentionShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of a Megatron ``linear_qkv`` tensor -> (q, k, v) rows in HF order."""
    per_group = shape.num_attention_heads // shape.num_query_groups
    grouped = fused.reshape(shape.num_query_groups, (per_group + 2) * shape.head_dim, *fused.shape[1:])
    q, k, v = grouped.split([per_group * shape.head_dim, shape.head_dim, shape.head_dim], dim=1)
    return (t.reshape(-1, *fused.shape[1:]) for t in (q, k, v))


def gather_adapter(
    model: nn.Module | list[nn.Module], local_weights: Mapping[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Logical (TP=1) adapter matrices keyed ``layers.<i>.<target>.lora_A`` / ``lora_B``.

    ``local_weights`` (slime's ``weights_getter()``: global parameter name -> this rank's CPU copy)
    replaces the live parameters as the source; the model then only supplies shapes and layouts, so
    this works while torch_memory_saver has the trainer's GPU memory paused.

    A collective over the tensor-parallel group: every TP rank must call it. Pipeline parallelism
    is not gathered here (each stage only holds its own layers).
    """
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized() and parallel_state.get_pipeline_model_parallel_world_size() > 1:
        raise NotImplementedError("LoRA export with pipeline parallelism > 1 is not supported; use PP=1")
    by_suffix: dict[str, torch.Tensor] = {}
    if local_weights is not None:
        marker = "decoder.layers."
        by_suffix = {k[k.index(marker) :]: v for k, v in local_weights.items() if marker in k and ".lora_" in k}
    out: dict[str, torch.Tensor] = {}
    for module in lora_modules(model):
        for name in ("lora_A", "lora_B"):
            local = None
            if local_weights is not None:
                suffix = module.lora_param_suffix(name)
                if suffix not in by_suffix:
                    raise KeyError(f"the weights copy has no {suffix} (has it {len(by_suffix)} adapter tensors?)")
                local = by_suffix[suffix]
            out[f"{module.lora_key}.{name}"] = module.lora_full(name, local).cpu()
    return out


def to_peft_state_dict(adapter: dict[str, torch.Tensor], shape: AttentionShape) -> dict[str, torch.Tensor]:
    """Megatron-named logical adapter -> PEFT tensor names with split q/k/v and gate/up."""
    peft: dict[str, torch.Tensor] = {}
    for key, a in adapter.items():
        if not key.endswith(".lora_A"):
            continue
        base = key[: -len(".lora_A")]
        _, index, target = base.split(".")
        b = adapter[f"{base}.lora_B"]
        if target == "linear_qkv":
            parts = dict(zip(("q_proj", "k_proj", "v_proj"), split_qkv_rows(b, shape), strict=True))
        elif target == "linear_fc1":
            parts = dict(zip(("gate_proj", "up_proj"), b.chunk(2, dim=0), strict=True))
        else:
            parts = {"o_proj" if target == "linear_proj" else "down_proj": b}
        for hf_name, b_part in parts.items():
            stem = f"{PEFT_PREFIX}.{index}.{_HF_PARENT[target]}.{hf_name}"
            peft[f"{stem}.lora_A.weight"] = a.contiguous().clone()
            peft[f"{stem}.lora_B.weight"] = b_part.contiguous().clone()
    return peft


def peft_adapter_config(config: LoraConfig, base_model: str | None = None) -> dict:
    """The ``adapter_config.json`` content, as PEFT itself writes it."""
    import peft

    cfg = peft.LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=config.hf_target_modules(),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
    )
    with tempfile.TemporaryDirectory() as tmp:
        cfg.save_pretrained(tmp)
        import json

        return json.loads((Path(tmp) / "adapter_config.json").read_text())


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    if not hasattr(libc, "renameat2"):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def peft_files(tensors: dict[str, torch.Tensor], adapter_config: dict) -> dict[str, bytes]:
    """The bytes of a PEFT folder's two files: what :func:`write_peft_dir` writes, and what a sync's
    checksum is taken of before the folder is read back (:func:`aclarena_slime.adapter_swap.files_checksum`)."""
    import json

    return {
        "adapter_model.safetensors": save_safetensors({k: v.contiguous() for k, v in tensors.items()}),
        "adapter_config.json": (json.dumps(adapter_config, indent=2, sort_keys=True) + "\n").encode(),
    }


def write_peft_dir(out_dir: str | os.PathLike, tensors: dict[str, torch.Tensor], adapter_config: dict) -> Path:
    """Write a PEFT directory so that ``out_dir`` always holds either the old or the new adapter, whole.

    Files go to a sibling temporary folder (fsynced), which then takes ``out_dir``'s place in one
    atomic swap; a crash before the swap leaves only a ``.tmp`` folder beside the good adapter.
    """
    target = Path(out_dir).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        for name, content in peft_files(tensors, adapter_config).items():
            with open(staging / name, "wb") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
        if not target.exists():
            os.rename(staging, target)
        elif target.is_dir() and _exchange(staging, target):
            shutil.rmtree(staging)  # now holds the previous adapter
        else:
            # No atomic swap here: keep the old adapter beside until the new one is in place.
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.rename(target, old)
            os.rename(staging, target)
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def export_peft(
    model: nn.Module | list[nn.Module],
    out_dir: str | os.PathLike,
    config: LoraConfig,
    *,
    base_model: str | None = None,
    write: bool = True,
) -> dict[str, torch.Tensor]:
    """Gather the adapter of a LoRA-injected megatron-core model and write it as a PEFT directory.

    Every TP rank must call this (the gather is a collective); only TP rank 0 writes, and only when
    ``write`` is true (pass False on data-parallel replicas). Returns the PEFT tensors.
    """
    chunks = model if isinstance(model, list | tuple) else [model]
    core_config = _unwrap(chunks[0]).config
    tensors = to_peft_state_dict(gather_adapter(chunks), AttentionShape.from_megatron(core_config))
    first = next(lora_modules(chunks))
    if write and first.lora_tp_rank() == 0:
        write_peft_dir(out_dir, tensors, peft_adapter_config(config, base_model))
    return tensors


def _unwrap(module: nn.Module) -> nn.Module:
    while hasattr(module, "module") and not hasattr(module, "config"):
        module = module.module
    return module
