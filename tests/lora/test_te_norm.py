"""The adapter's input on TransformerEngine's fused norm-linear, against TE's own formula (issue 27 item 6).

With slime's TE spec, ``linear_qkv`` / ``linear_fc1`` are ``TELayerNormColumnParallelLinear``: the norm runs inside
the linear, and the LoRA branch recomputes it from the layer's attributes. TransformerEngine does not run on a
CPU, so the layer here is megatron-core's real ``ColumnParallelLinear`` with the attributes TE's ``LayerNormLinear``
holds (``layer_norm_weight``, ``layer_norm_bias`` (None for RMSNorm), ``normalization``, ``zero_centered_gamma``,
``eps``, set as megatron's TE wrapper sets them from ``config.normalization``,
``config.layernorm_zero_centered_gamma`` and ``config.layernorm_epsilon``) and TE's documented forward: norm,
then the GEMM. Every combination the Qwen3 spec can produce is checked, in fp32 and bf16.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from aclarena_slime.lora import LoraConfig
from aclarena_slime.lora.layers import _lora_class

HIDDEN, OUT, EPS = 32, 48, 1e-6
COMBINATIONS = list(itertools.product(("RMSNorm", "LayerNorm"), (False, True), (torch.float32, torch.bfloat16)))


def te_norm(x: torch.Tensor, normalization: str, zero_centered_gamma: bool, weight, bias, eps: float) -> torch.Tensor:
    """TE's LayerNormLinear norm (transformer_engine.pytorch docs): computed in fp32, returned in the input's dtype.
    LayerNorm: (x - E[x]) / sqrt(Var[x] + eps) * g + b; RMSNorm: x / sqrt(E[x^2] + eps) * g; with
    zero_centered_gamma g = 1 + gamma, else gamma."""
    xf = x.float()
    gamma = weight.float() + 1.0 if zero_centered_gamma else weight.float()
    if normalization == "RMSNorm":
        y = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gamma
    else:
        mean = xf.mean(-1, keepdim=True)
        var = (xf - mean).pow(2).mean(-1, keepdim=True)
        y = (xf - mean) / torch.sqrt(var + eps) * gamma + bias.float()
    return y.to(x.dtype)


def te_layer(normalization: str, zero_centered_gamma: bool, dtype: torch.dtype) -> nn.Module:
    """A column-parallel linear holding TE's LayerNormLinear attributes, whose forward is TE's: norm, then GEMM."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, use_cpu_initialization=True, params_dtype=dtype,
        normalization=normalization, layernorm_zero_centered_gamma=zero_centered_gamma, layernorm_epsilon=EPS,
        gradient_accumulation_fusion=False,
    )  # fmt: skip

    class TELayerNormColumnParallelLinearStandIn(ColumnParallelLinear):
        def __init__(self) -> None:
            super().__init__(HIDDEN, OUT, config=config, init_method=nn.init.normal_, bias=False, skip_bias_add=True)
            g = torch.Generator().manual_seed(7)
            self.normalization = config.normalization
            self.zero_centered_gamma = config.layernorm_zero_centered_gamma
            self.eps = config.layernorm_epsilon
            # zero-centred: stored near 0 (TE initialises it to zeros); otherwise near 1
            centre = 0.0 if zero_centered_gamma else 1.0
            weight = centre + 0.3 * torch.randn(HIDDEN, generator=g)
            self.layer_norm_weight = nn.Parameter(weight.to(dtype))
            bias = (
                None if normalization == "RMSNorm" else nn.Parameter((0.2 * torch.randn(HIDDEN, generator=g)).to(dtype))
            )
            self.layer_norm_bias = bias

        def forward(self, input_, *args, **kwargs):
            normed = te_norm(input_, self.normalization, self.zero_centered_gamma, self.layer_norm_weight,
                             self.layer_norm_bias, self.eps)  # fmt: skip
            return super().forward(normed, *args, **kwargs)

    return TELayerNormColumnParallelLinearStandIn()


@pytest.mark.parametrize(("normalization", "zero_centered_gamma", "dtype"), COMBINATIONS)
def test_the_adapter_sees_tes_normalised_input(tp1, normalization, zero_centered_gamma, dtype):
    layer = te_layer(normalization, zero_centered_gamma, dtype)
    layer.__class__ = _lora_class(type(layer))  # what inject_lora does to slime's linear_qkv / linear_fc1
    layer.lora_setup("layers.0.linear_qkv", "linear_qkv", LoraConfig(rank=4, alpha=8), gated=False)
    with torch.no_grad():
        layer.lora_B.weight.normal_(generator=torch.Generator().manual_seed(3))
    x = (3.0 * torch.randn(5, 2, HIDDEN, generator=torch.Generator().manual_seed(1)) + 0.5).to(dtype)
    expected = te_norm(x, normalization, zero_centered_gamma, layer.layer_norm_weight, layer.layer_norm_bias, EPS)
    tol = {"atol": 1e-6, "rtol": 1e-6} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(layer._lora_input(x), expected, **tol)
    with torch.no_grad():
        out, _ = layer(x)
        layer.lora_enabled = False
        base, _ = layer(x)
    branch = layer.lora_B(layer.lora_A(expected)) * layer.lora_scaling
    torch.testing.assert_close(
        out - base, branch.to(out.dtype), **(tol if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.1})
    )


def test_the_adapter_refuses_nothing_silently_on_an_unknown_norm(tp1):
    """A norm TE could add later must not fall through to another formula."""
    layer = te_layer("RMSNorm", False, torch.float32)
    layer.__class__ = _lora_class(type(layer))
    layer.lora_setup("layers.0.linear_fc1", "linear_fc1", LoraConfig(rank=4, alpha=8), gated=True)
    layer.normalization = "SomeNewNorm"
    with pytest.raises(ValueError, match="SomeNewNorm"):
        layer._lora_input(torch.randn(2, 1, HIDDEN))
