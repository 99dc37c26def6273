"""LoRA adapters grafted onto megatron-core's parallel linears, sharded like the layer they adapt.

The adapted module keeps its class (a subclass is swapped in) and its parameter names, so a backbone
checkpoint loads unchanged; the adapter adds ``<module>.lora_A.weight`` and ``<module>.lora_B.weight``.

Tensor parallelism (Hu et al. 2021 LoRA, sharded as in Megatron-Bridge's ``LoRALinear`` design):
- column-parallel base (``linear_qkv``, ``linear_fc1``; output sharded): A replicated, B sharded on
  its output like the base weight. ``h = A x`` is identical on every rank; its gradient is summed over
  the TP group (``copy_to_tensor_model_parallel_region``), so A and x get full gradients.
- row-parallel base (``linear_proj``, ``linear_fc2``; input sharded): A sharded on its input, the
  partial ``A_t x_t`` summed over the group (``reduce_from_tensor_model_parallel_region``), B replicated.
Sequence parallelism changes the input layout of the branch and is refused.

Several adapters (parallel MLE, ``LoraConfig.experts``): each layer stacks N adapters, A as ``[N*r, in]`` and
B as ``[out, N*r]`` (so the TP layouts above hold unchanged), and every token selects one of them by its
sample's adapter index (:func:`adapter_index`): ``h = A x`` is masked to the selected adapter's r rows
before B, so a sample's gradient reaches only its own A and B blocks, as in multi-tenant LoRA trainers. TransformerEngine's
``TELayerNormColumnParallelLinear`` fuses the norm into the linear; the branch applies the layer's own
norm weights itself so it sees the same normalised input as the base GEMM.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .config import LoraConfig, LoraConfigError
from .tp_layout import REPLICATED, TPLayout, shard, unshard

COLUMN_TARGETS = ("linear_qkv", "linear_fc1")
ROW_TARGETS = ("linear_proj", "linear_fc2")
_PARENT = {"linear_qkv": "self_attention", "linear_proj": "self_attention", "linear_fc1": "mlp", "linear_fc2": "mlp"}


class LoraLinearMixin:
    """Mixed into the class of an adapted megatron linear; see the module docstring."""

    lora_key: str
    lora_parallel: str
    lora_layouts: dict[str, TPLayout]
    lora_scaling: float
    lora_enabled: bool
    lora_num_adapters: int = 1
    lora_rank: int
    lora_adapter_index: torch.Tensor | None = None

    def lora_setup(self, key: str, target: str, config: LoraConfig, gated: bool) -> None:
        """Create A and B for this layer; ``key`` is the layer's global name, e.g. ``layers.3.linear_qkv``."""
        if getattr(self.config, "sequence_parallel", False):
            raise LoraConfigError(
                f"{key}: LoRA does not support sequence parallelism; drop --sequence-parallel "
                "(the adapter branch would see a sequence-sharded input)"
            )
        if getattr(self, "gather_output", False) or getattr(self, "input_is_parallel", True) is False:
            raise LoraConfigError(f"{key}: LoRA needs gather_output=False / input_is_parallel=True (GPT defaults)")
        weight = self.weight
        out_local, in_local = weight.shape
        tp = self.lora_tp_size()
        column = target in COLUMN_TARGETS
        self.lora_key = key
        self.lora_parallel = "column" if column else "row"
        self.lora_scaling = config.scaling
        self.lora_enabled = True
        self.lora_num_adapters, self.lora_rank = config.num_adapters, config.rank
        self.lora_adapter_index = None
        stacked = config.num_adapters * config.rank
        if column:
            self.lora_layouts = {"lora_A": REPLICATED, "lora_B": TPLayout(dim=0, glu=gated and target == "linear_fc1")}
        else:
            self.lora_layouts = {"lora_A": TPLayout(dim=1), "lora_B": REPLICATED}
        a_shape, b_shape = (stacked, in_local), (out_local, stacked)
        factory = {"device": weight.device, "dtype": weight.dtype}
        self.lora_A = nn.Linear(a_shape[1], a_shape[0], bias=False, **factory)
        self.lora_B = nn.Linear(b_shape[1], b_shape[0], bias=False, **factory)
        self.lora_dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()
        self._mark_parallel_attributes()
        # PEFT's initialisation: A Kaiming-uniform, B zero, so the adapted model equals the backbone.
        full_a = torch.empty(config.rank, in_local * (1 if column else tp))
        generator = torch.Generator().manual_seed(config.init_seed + zlib.crc32(key.encode()))
        nn.init.kaiming_uniform_(full_a, a=math.sqrt(5), generator=generator)
        # Every stacked adapter starts as a lone adapter would (side by side equals alone).
        self.lora_set_full("lora_A", full_a.repeat(config.num_adapters, 1))
        with torch.no_grad():
            self.lora_B.weight.zero_()

    def _mark_parallel_attributes(self) -> None:
        from megatron.core.tensor_parallel.layers import (
            set_defaults_if_not_set_tensor_model_parallel_attributes,
            set_tensor_model_parallel_attributes,
        )

        for name, layout in self.lora_layouts.items():
            param = getattr(self, name).weight
            if layout.dim is None:
                set_defaults_if_not_set_tensor_model_parallel_attributes(param)
            else:
                set_tensor_model_parallel_attributes(param, is_parallel=True, dim=layout.dim, stride=1)

    def lora_tp_group(self) -> torch.distributed.ProcessGroup | None:
        group = getattr(self, "tp_group", None) or getattr(self, "_tp_group", None)
        if group is None and torch.distributed.is_initialized():
            from megatron.core import parallel_state

            if parallel_state.model_parallel_is_initialized():
                group = parallel_state.get_tensor_model_parallel_group()
        return group

    def lora_tp_size(self) -> int:
        group = self.lora_tp_group()
        return torch.distributed.get_world_size(group) if group is not None else 1

    def lora_tp_rank(self) -> int:
        group = self.lora_tp_group()
        return torch.distributed.get_rank(group) if group is not None else 0

    @torch.no_grad()
    def lora_set_full(self, name: str, full: torch.Tensor) -> None:
        """Copy this rank's block of a logical (TP=1) adapter matrix into ``lora_A`` / ``lora_B``."""
        param = getattr(self, name).weight
        block = shard(full, self.lora_layouts[name], self.lora_tp_rank(), self.lora_tp_size())
        if block.shape != param.shape:
            raise ValueError(
                f"{self.lora_key}.{name}: logical shape {tuple(full.shape)} does not fit {tuple(param.shape)}"
            )
        param.copy_(block.to(param.dtype))

    @torch.no_grad()
    def lora_full(self, name: str, local: torch.Tensor | None = None) -> torch.Tensor:
        """The logical (TP=1) adapter matrix; a collective over the TP group when it is sharded.

        ``local`` is this rank's block taken from elsewhere than the live parameter (slime's CPU copy,
        while the trainer's GPU memory is paused); only the live parameter's shape is read then.
        """
        live = getattr(self, name).weight
        if local is not None and tuple(local.shape) != tuple(live.shape):
            raise ValueError(
                f"{self.lora_key}.{name}: copy of shape {tuple(local.shape)}, parameter {tuple(live.shape)}"
            )
        block = (live if local is None else local).detach()
        layout, size = self.lora_layouts[name], self.lora_tp_size()
        if layout.dim is None or size == 1:
            return block.clone()
        group = self.lora_tp_group()
        if torch.distributed.get_backend(group) == "nccl":
            block = block.to(torch.device("cuda", torch.cuda.current_device()))
        blocks = [torch.empty_like(block) for _ in range(size)]
        torch.distributed.all_gather(blocks, block.contiguous(), group=group)
        return unshard(blocks, layout)

    def lora_param_suffix(self, name: str) -> str:
        """The parameter's global name from ``decoder.layers.`` on (layer index with the pipeline offset)."""
        _, index, target = self.lora_key.split(".")
        return f"decoder.layers.{index}.{_PARENT[target]}.{target}.{name}.weight"

    def _lora_input(self, x: torch.Tensor) -> torch.Tensor:
        norm_weight = getattr(self, "layer_norm_weight", None)
        if norm_weight is None:
            return x
        # TELayerNormColumnParallelLinear: the base GEMM sees norm(x); so must the branch. TE's formula, in fp32,
        # with gamma stored as gamma - 1 under zero_centered_gamma (tests/lora/test_te_norm.py).
        weight = norm_weight.float() + (1.0 if getattr(self, "zero_centered_gamma", False) else 0.0)
        xf = x.float()
        normalization = getattr(self, "normalization", "LayerNorm")
        if normalization == "RMSNorm":
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * weight
        elif normalization == "LayerNorm":
            bias = getattr(self, "layer_norm_bias", None)
            y = F.layer_norm(xf, (xf.shape[-1],), weight, None if bias is None else bias.float(), self.eps)
        else:
            raise ValueError(f"{self.lora_key}: the adapter reproduces LayerNorm and RMSNorm, not {normalization!r}")
        return y.to(x.dtype)

    def lora_delta(self, x: torch.Tensor) -> torch.Tensor:
        """The adapter's contribution to this rank's output block."""
        from megatron.core.tensor_parallel.mappings import (
            copy_to_tensor_model_parallel_region,
            reduce_from_tensor_model_parallel_region,
        )

        h = self.lora_A(self.lora_dropout(self._lora_input(x)))
        if self.lora_tp_size() > 1:
            mapping = (
                copy_to_tensor_model_parallel_region
                if self.lora_parallel == "column"
                else reduce_from_tensor_model_parallel_region
            )
            h = mapping(h, group=self.lora_tp_group())
        if self.lora_num_adapters > 1:
            h = h * self._lora_selection(h)
        return self.lora_B(h) * self.lora_scaling

    def _lora_selection(self, h: torch.Tensor) -> torch.Tensor:
        """Per token, 1 on the r rows of its sample's adapter and 0 elsewhere (shape ``h.shape``)."""
        index = self.lora_adapter_index
        if index is None:
            raise LoraConfigError(
                f"{self.lora_key}: {self.lora_num_adapters} stacked adapters and no adapter index; set one with "
                "set_adapter_index(model, index)"
            )
        if tuple(index.shape) != tuple(h.shape[:-1]):
            raise ValueError(f"{self.lora_key}: adapter index of shape {tuple(index.shape)} for input {tuple(h.shape)}")
        one_hot = F.one_hot(index.to(device=h.device, dtype=torch.long), self.lora_num_adapters).to(h.dtype)
        return one_hot.repeat_interleave(self.lora_rank, dim=-1)

    def forward(self, input_: torch.Tensor, *args, **kwargs):  # noqa: D401 - megatron's signature
        out, bias = super().forward(input_, *args, **kwargs)
        if not self.lora_enabled:
            return out, bias
        return out + self.lora_delta(input_).to(out.dtype), bias

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """The base layer's sharded state plus A and B sharded by their own layouts (dist-checkpointing)."""
        from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        result = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        for key in [k for k in result if k.startswith(f"{prefix}lora_")]:
            del result[key]
        tensors = {f"{name}.weight": getattr(self, name).weight for name in self.lora_layouts}
        axes = {f"{name}.weight": lay.dim for name, lay in self.lora_layouts.items() if lay.dim is not None}
        dp_cp_group = (metadata or {}).get("dp_cp_group")
        if dp_cp_group is None:
            from megatron.core import parallel_state

            dp_cp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        sharded = make_sharded_tensors_for_checkpoint(
            tensors, prefix, axes, sharded_offsets, tp_group=self.lora_tp_group(), dp_cp_group=dp_cp_group
        )
        if self.lora_layouts["lora_B"].glu:
            singleton = (metadata or {}).get("singleton_local_shards", False)
            key = f"{prefix}lora_B.weight"
            sharded[key] = apply_swiglu_sharded_factory(sharded[key], sharded_offsets, singleton)
        result.update(sharded)
        return result


_CLASS_CACHE: dict[type, type] = {}


def _lora_class(base: type) -> type:
    if base not in _CLASS_CACHE:
        _CLASS_CACHE[base] = type(f"Lora{base.__name__}", (LoraLinearMixin, base), {})
    return _CLASS_CACHE[base]


def _is_adapter_key(key: str) -> bool:
    return ".lora_A." in key or ".lora_B." in key


def _allow_backbone_only_load(module: nn.Module, incompatible) -> None:
    """A checkpoint without any adapter key is a backbone: keep the fresh adapter (B = 0)."""
    missing = incompatible.missing_keys
    adapter_missing = [k for k in missing if _is_adapter_key(k)]
    expected = sum(1 for n, _ in module.named_parameters() if _is_adapter_key(n))
    if adapter_missing and len(adapter_missing) == expected:
        for key in adapter_missing:
            missing.remove(key)


def _embedding_output_requires_grad(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    """Forward hook on the frozen embedding (PEFT's ``enable_input_require_grads`` for megatron-core).

    Megatron's activation recompute (``tensor_parallel.checkpoint``) returns a tensor that tracks
    gradients only if one of its inputs does; the frozen embedding's output does not, so without this
    the loss has no graph to the adapters and Megatron's schedule silently skips the backward.
    """
    if torch.is_grad_enabled() and torch.is_tensor(output) and not output.requires_grad:
        output.requires_grad_(True)
    return output


def inject_lora(model: nn.Module, config: LoraConfig) -> list[str]:
    """Adapt ``config.target_modules`` in every transformer layer of a megatron-core GPT model and
    freeze everything else. Returns the global keys of the adapted layers (``layers.<i>.<target>``).

    The embedding's output is made to require grad (see :func:`_embedding_output_requires_grad`), so
    the returned model trains under every activation-recompute setting.
    """
    from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding

    keys: list[str] = []
    gated = bool(getattr(getattr(model, "config", None), "gated_linear_unit", False))
    for layer in model.modules():
        layer_number = getattr(layer, "layer_number", None)
        if layer_number is None or not hasattr(layer, "self_attention"):
            continue
        for target in config.target_modules:
            parent = getattr(layer, _PARENT[target], None)
            module = getattr(parent, target, None)
            if module is None:
                raise LoraConfigError(
                    f"layer {layer_number}: no {_PARENT[target]}.{target} to adapt (MoE or MLA layers are not supported)"
                )
            if isinstance(module, LoraLinearMixin):
                raise LoraConfigError(f"layer {layer_number}: {target} already has a LoRA adapter")
            module.__class__ = _lora_class(type(module))
            key = f"layers.{layer_number - 1}.{target}"
            module.lora_setup(key, target, config, gated)
            keys.append(key)
    if not keys:
        raise LoraConfigError("no transformer layer found to adapt: is this a megatron-core GPT model?")
    for name, param in model.named_parameters():
        param.requires_grad = _is_adapter_key(name)
    for module in model.modules():
        if isinstance(module, LanguageModelEmbedding):  # absent on pipeline stages after the first
            module.register_forward_hook(_embedding_output_requires_grad)
    model.register_load_state_dict_post_hook(_allow_backbone_only_load)
    return keys


def lora_modules(model: nn.Module | list[nn.Module]) -> Iterator[LoraLinearMixin]:
    """Every adapted layer, in module order; accepts slime's list of model chunks."""
    chunks = model if isinstance(model, list | tuple) else [model]
    for chunk in chunks:
        for module in chunk.modules():
            if isinstance(module, LoraLinearMixin):
                yield module


def set_adapters_enabled(model: nn.Module | list[nn.Module], enabled: bool) -> None:
    """Switch every adapter on or off (off: the model is exactly the backbone, e.g. for the KL reference)."""
    for module in lora_modules(model):
        module.lora_enabled = enabled


@contextmanager
def adapters_disabled(model: nn.Module | list[nn.Module]) -> Iterator[None]:
    """Run a block with the backbone alone, then restore the adapters' previous state."""
    modules = list(lora_modules(model))
    before = [m.lora_enabled for m in modules]
    for module in modules:
        module.lora_enabled = False
    try:
        yield
    finally:
        for module, state in zip(modules, before, strict=True):
            module.lora_enabled = state


def set_adapter_index(model: nn.Module | list[nn.Module], index: torch.Tensor | None) -> None:
    """Choose each token's adapter (stacked adapters, parallel MLE) for the forwards that follow.

    ``index`` holds one adapter number per token, shaped as the layers' input without its hidden dim
    (megatron-core's ``[sequence, batch]``); None clears it. It must stay set until the micro-batch's
    backward has run: activation recompute runs the layers' forward again then.
    """
    modules = list(lora_modules(model))
    if index is not None and modules:
        count = modules[0].lora_num_adapters
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= count):
            raise ValueError(f"adapter index out of range [0, {count}): {index.unique().tolist()}")
    for module in modules:
        module.lora_adapter_index = index


@contextmanager
def adapter_index(model: nn.Module | list[nn.Module], index: torch.Tensor) -> Iterator[None]:
    """:func:`set_adapter_index` for a block (forward and backward inside it), cleared afterwards."""
    set_adapter_index(model, index)
    try:
        yield
    finally:
        set_adapter_index(model, None)


def select_expert(adapter: dict[str, torch.Tensor], index: int, rank: int) -> dict[str, torch.Tensor]:
    """One expert's logical matrices out of stacked ones (keys as :func:`~aclarena_slime.lora.export.gather_adapter`):
    A's rows and B's columns ``[index*rank, (index+1)*rank)``."""
    rows = slice(index * rank, (index + 1) * rank)
    out = {}
    for key, value in adapter.items():
        if key.endswith(".lora_A"):
            out[key] = value[rows].clone()
        elif key.endswith(".lora_B"):
            out[key] = value[:, rows].clone()
        else:
            raise KeyError(f"not an adapter matrix: {key}")
        if out[key].numel() == 0:
            raise ValueError(f"{key}: no expert {index} in a matrix of shape {tuple(value.shape)} at rank {rank}")
    return out


def randomize_adapters(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Give B (and A) random TP-invariant values, so an adapter has a visible effect (tests, selftest)."""
    for module in lora_modules(model):
        generator = torch.Generator().manual_seed(seed + zlib.crc32(module.lora_key.encode()))
        for name in ("lora_A", "lora_B"):
            shape = list(getattr(module, name).weight.shape)
            layout = module.lora_layouts[name]
            if layout.dim is not None:
                shape[layout.dim] *= module.lora_tp_size()
            module.lora_set_full(name, torch.randn(shape, generator=generator) * std)
