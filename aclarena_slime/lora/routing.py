"""How a sample's adapter index reaches the stacked LoRA layers on slime (parallel MLE).

Slime has no per-sample field that reaches the model's forward except ``Sample.multimodal_train_inputs``:
a dict of tensors per sample that slime's ``get_batch`` concatenates over the micro-batch's samples and
``forward_step`` passes to the model as keyword arguments (slime/backends/megatron_utils/data.py and
model.py at 624b824). So the rollout puts ``{ADAPTER_INDEX_KEY: tensor([k])}`` on each training sample
(:func:`tag_sample`), and a forward pre-hook on the GPT model (:func:`install`) takes that keyword out,
expands it to one index per token of slime's packed ``thd`` stream with the micro-batch's ``cu_seqlens``,
and sets it on the layers (:func:`~aclarena_slime.lora.layers.set_adapter_index`). The index stays set
until the next forward, so the micro-batch's backward (activation recompute included) sees it; with
pipeline parallelism 1 (the only layout the LoRA recipes allow) a micro-batch's backward runs before
the next forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .config import LoraConfigError
from .layers import set_adapter_index

ADAPTER_INDEX_KEY = "aclarena_adapter_index"
_last: dict[str, list[int] | None] = {"index": None}  # the per-sample indices of the last forward (parity reads them)


def tag_sample(sample: Any, experts: Sequence[str], tag: str) -> None:
    """Mark a training sample with its env's adapter index: ``tag``'s place in ``experts`` (parallel MLE)."""
    if tag not in experts:
        raise LoraConfigError(f"no parallel-MLE expert for env tag {tag!r}; lora experts: {list(experts)}")
    inputs = dict(getattr(sample, "multimodal_train_inputs", None) or {})
    inputs[ADAPTER_INDEX_KEY] = torch.tensor([list(experts).index(tag)], dtype=torch.long)
    sample.multimodal_train_inputs = inputs


def per_token_index(sample_index: torch.Tensor, cu_seqlens: torch.Tensor, cp_size: int = 1) -> torch.Tensor:
    """One adapter index per token of slime's packed stream, shaped ``[tokens, 1]`` (megatron's ``[s, b]``).

    ``cu_seqlens`` are slime's: the samples' boundaries scaled by ``cp_size`` (each context-parallel rank
    holds 1/cp of every sample), plus one trailing segment of padding when the stream was padded; padding
    takes adapter 0 (its loss mask is 0).
    """
    lengths = torch.diff(cu_seqlens.to(torch.long)) // cp_size
    n = sample_index.numel()
    if len(lengths) not in (n, n + 1):
        raise ValueError(f"{n} adapter indices for {len(lengths)} packed segments: one per sample expected")
    index = sample_index.to(torch.long).reshape(-1)
    if len(lengths) == n + 1:
        index = torch.cat([index, index.new_zeros(1)])
    return torch.repeat_interleave(index.to(lengths.device), lengths).unsqueeze(1)


def _pre_forward(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    index = kwargs.pop(ADAPTER_INDEX_KEY, None)
    if index is not None:
        from megatron.core import parallel_state

        packed = kwargs.get("packed_seq_params")
        if packed is None:
            raise ValueError(f"{ADAPTER_INDEX_KEY} needs slime's packed (thd) batches")
        cp = parallel_state.get_context_parallel_world_size() if parallel_state.model_parallel_is_initialized() else 1
        set_adapter_index(module, per_token_index(index, packed.cu_seqlens_q, cp))
        _last["index"] = [int(k) for k in index.reshape(-1).tolist()]
    return args, kwargs


def last_sample_index() -> list[int] | None:
    """Each sample's adapter index in the micro-batch of the last forward (what its loss sees), or None."""
    return _last["index"]


def install(model: nn.Module) -> None:
    """Let ``model``'s forward take the per-sample adapter index as slime passes it (see the module docstring)."""
    model.register_forward_pre_hook(_pre_forward, with_kwargs=True)
