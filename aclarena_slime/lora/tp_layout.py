"""How one logical (TP=1) tensor is laid out across tensor-parallel ranks in megatron-core.

Sharded tensors are split into contiguous blocks along one dimension, except a gated MLP's
``linear_fc1`` output: each rank holds ``[gate_t; up_t]``, because the MLP chunks its local output
in two (megatron-core ``transformer/mlp.py``, ``apply_swiglu_sharded_factory``). Export, checkpoint
conversion and TP-invariant initialisation all go through these two functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TPLayout:
    """``dim``: the sharded dimension, None when replicated; ``glu``: fc1's per-rank [gate; up]."""

    dim: int | None
    glu: bool = False


REPLICATED = TPLayout(dim=None)


def shard(full: torch.Tensor, layout: TPLayout, rank: int, size: int) -> torch.Tensor:
    """The block of ``full`` that ``rank`` of ``size`` holds."""
    if layout.dim is None or size == 1:
        return full
    if full.shape[layout.dim] % (2 * size if layout.glu else size):
        raise ValueError(f"dimension {layout.dim} of shape {tuple(full.shape)} does not split over {size} ranks")
    if layout.glu:
        gate, up = full.chunk(2, dim=layout.dim)
        return torch.cat([gate.chunk(size, dim=layout.dim)[rank], up.chunk(size, dim=layout.dim)[rank]], layout.dim)
    return full.chunk(size, dim=layout.dim)[rank]


def unshard(shards: Sequence[torch.Tensor], layout: TPLayout) -> torch.Tensor:
    """The logical tensor from every rank's block (in rank order)."""
    if layout.dim is None or len(shards) == 1:
        return shards[0]
    if layout.glu:
        halves = [s.chunk(2, dim=layout.dim) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], layout.dim)
    return torch.cat(list(shards), layout.dim)


def backbone_layout(name: str, param: torch.Tensor, gated_linear_unit: bool) -> TPLayout:
    """Layout of a megatron-core backbone parameter, from the attributes megatron sets on it."""
    if not getattr(param, "tensor_model_parallel", False):
        return REPLICATED
    glu = gated_linear_unit and (name.endswith("linear_fc1.weight") or name.endswith("linear_fc1.bias"))
    return TPLayout(dim=int(param.partition_dim), glu=glu)
