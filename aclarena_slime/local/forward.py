"""One forward for a whole batch of sequences: a minimal decoder pass over a Hugging Face model's weights.

Transformers' generic path costs more Python per step than the tiny models' arithmetic, and its
caches are one tensor per batch, so sequences cannot join or leave it. This pass reads the same
weights (Llama/Qwen2/Qwen3-shaped decoders: ``model.layers[i].self_attn.{q,k,v,o}_proj``,
``mlp.{gate,up,down}_proj``, optional ``q_norm``/``k_norm``) and keeps a padded KV cache with one row
(slot) per sequence: a prefill writes the rows of new sequences, a decode step appends one token to
every live row and attends under a mask of each row's length. LoRA adapters are applied per row,
grouped by adapter (``x[rows] @ A.T @ B.T`` added back to those rows): on CPU that measured 6-16x
faster than a per-row gather of the adapter weights (``docs/notes-engine.md``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

# Projections an adapter may target, as PEFT names them; the embedding is not one of them.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
CACHE_CHUNK = 64  # the KV cache grows (and shrinks) by this many positions


class UnsupportedModel(ValueError):
    """A model or adapter this forward cannot run exactly (the message says what)."""


@dataclass(frozen=True)
class LoraWeights:
    """One adapter: ``module path -> (A [r, in], B * scaling [out, r])``."""

    layers: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def from_peft_dir(cls, path: Path, modules: dict[str, torch.nn.Linear]) -> LoraWeights:
        """Read a PEFT LoRA directory, refusing any feature this forward would not reproduce."""
        config = json.loads((path / "adapter_config.json").read_text())
        refused = {
            "peft_type": config.get("peft_type", "LORA") != "LORA",
            "use_dora": bool(config.get("use_dora")),
            "modules_to_save": bool(config.get("modules_to_save")),
            "rank_pattern": bool(config.get("rank_pattern")),
            "alpha_pattern": bool(config.get("alpha_pattern")),
            "fan_in_fan_out": bool(config.get("fan_in_fan_out")),
            "bias": config.get("bias", "none") != "none",
        }
        bad = sorted(k for k, v in refused.items() if v)
        if bad:
            raise UnsupportedModel(f"{path}: the local engine serves plain LoRA adapters; this one sets {bad}")
        rank, alpha = int(config["r"]), float(config["lora_alpha"])
        scaling = alpha / rank**0.5 if config.get("use_rslora") else alpha / rank
        state = _read_state(path)
        out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for key, a in state.items():
            if ".lora_embedding_" in key:
                raise UnsupportedModel(f"{path}: LoRA on embeddings ({key}) is not served by the local engine")
            if not key.endswith(".lora_A.weight"):
                continue
            module = key.removesuffix(".lora_A.weight").removeprefix("base_model.model.")
            b = state.get(key.replace(".lora_A.", ".lora_B."))
            linear = modules.get(module)
            if b is None or linear is None:
                raise UnsupportedModel(f"{path}: {module} is not a projection this engine adapts ({LORA_TARGETS})")
            if a.shape[1] != linear.in_features or b.shape[0] != linear.out_features:
                raise UnsupportedModel(
                    f"{path}: {module} has shapes {tuple(a.shape)}/{tuple(b.shape)}, not the model's"
                )
            out[module] = (a.float().contiguous(), (b.float() * scaling).contiguous())
        if not out:
            raise UnsupportedModel(f"{path}: no LoRA weights found")
        return cls(out)


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    if (path / "adapter_model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(path / "adapter_model.safetensors"))
    if (path / "adapter_model.bin").is_file():
        return torch.load(path / "adapter_model.bin", map_location="cpu", weights_only=True)
    raise UnsupportedModel(f"{path}: no adapter_model.safetensors or adapter_model.bin")


# Rows of a batch that share an adapter: (row indices, None when the group is the whole batch; adapter).
Groups = Sequence[tuple[torch.Tensor | None, LoraWeights]]


class KVCache:
    """Keys and values of up to ``slots`` sequences, padded to a common length (rows 0..n-1 live)."""

    def __init__(self, layers: int, slots: int, kv_heads: int, head_dim: int) -> None:
        self.layers, self.slots, self.kv_heads, self.head_dim = layers, slots, kv_heads, head_dim
        self.capacity = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def fit(self, length: int) -> None:
        """Make room for ``length`` positions per row (growing, or shrinking when most is unused)."""
        want = -(-length // CACHE_CHUNK) * CACHE_CHUNK
        if want <= self.capacity and want > self.capacity - 2 * CACHE_CHUNK:
            return
        keep = min(want, self.capacity)
        shape = (self.slots, self.kv_heads, want, self.head_dim)
        k = [torch.zeros(shape) for _ in range(self.layers)]
        v = [torch.zeros(shape) for _ in range(self.layers)]
        for new, old in zip(k + v, self.k + self.v, strict=False):  # nothing to keep in a new cache
            new[:, :, :keep] = old[:, :, :keep]
        self.k, self.v, self.capacity = k, v, want

    def move(self, src: int, dst: int) -> None:
        """Copy row ``src`` over row ``dst`` (a sequence leaving makes room for the last one)."""
        for t in self.k + self.v:
            t[dst] = t[src]

    def clear(self) -> None:
        self.k, self.v, self.capacity = [], [], 0


class BatchForward:
    """The decoder pass over ``model``'s own modules (no copies of the weights)."""

    def __init__(self, model: Any) -> None:
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        config = model.config
        if layers is None or not all(_is_plain_layer(layer) for layer in layers):
            raise UnsupportedModel(
                f"the local engine runs Llama/Qwen-shaped decoders; {type(model).__name__} is not one"
            )
        if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
            raise UnsupportedModel("the local engine runs full attention only (no sliding window)")
        self.model, self.inner, self.layers = model, inner, list(layers)
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.scaling = float(attn.scaling)
        self.linears: dict[str, torch.nn.Linear] = {
            name: module
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LORA_TARGETS
        }

    def new_cache(self, slots: int) -> KVCache:
        return KVCache(len(self.layers), slots, self.kv_heads, self.head_dim)

    def prefill(
        self, ids: torch.Tensor, lengths: torch.Tensor, cache: KVCache, first: int, groups: Groups
    ) -> torch.Tensor:
        """Run right-padded prompts ``ids`` [n, L] into cache rows ``first..first+n``; logits at each prompt's end."""
        n, length = ids.shape
        positions = torch.arange(length).expand(n, length)
        x = self.inner.embed_tokens(ids)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, i, x, positions, groups)  # [n, L, heads, hd]
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            cache.k[i][first : first + n, :, :length] = k
            cache.v[i][first : first + n, :, :length] = v
            # Right padding: the causal mask already keeps every real position off the padding after it.
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling, enable_gqa=True)
            x = self._rest(layer, i, x, attn.transpose(1, 2).reshape(n, length, -1), groups)
        last = x[torch.arange(n), lengths - 1]
        return self._logits(last, groups)

    def decode(self, tokens: torch.Tensor, lengths: torch.Tensor, cache: KVCache, groups: Groups) -> torch.Tensor:
        """One new token for each of the first ``n`` rows, at position ``lengths`` [n]; next-token logits [n, V]."""
        n = tokens.shape[0]
        rows = torch.arange(n)
        x = self.inner.embed_tokens(tokens.unsqueeze(1))  # [n, 1, hidden]
        visible = (torch.arange(cache.capacity) <= lengths.unsqueeze(1)).view(n, 1, 1, -1)
        group = self.heads // self.kv_heads
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, i, x, lengths.unsqueeze(1), groups)  # [n, 1, heads, hd]
            keys, values = cache.k[i], cache.v[i]
            keys[rows, :, lengths] = k[:, 0]
            values[rows, :, lengths] = v[:, 0]
            q = q.view(n, self.kv_heads, group, self.head_dim)
            scores = torch.matmul(q, keys[:n].transpose(-1, -2)) * self.scaling  # [n, kv, group, capacity]
            probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
            attn = torch.matmul(probs, values[:n]).reshape(n, 1, -1)
            x = self._rest(layer, i, x, attn, groups)
        return self._logits(x[:, 0], groups)

    # --- the layer's pieces ---------------------------------------------------------------------------

    def _linear(self, name: str, module: torch.nn.Linear, x: torch.Tensor, groups: Groups) -> torch.Tensor:
        out = F.linear(x, module.weight, module.bias)
        for rows, lora in groups:
            ab = lora.layers.get(name)
            if ab is None:
                continue
            if rows is None:
                out += (x @ ab[0].T) @ ab[1].T
            else:
                out.index_add_(0, rows, (x.index_select(0, rows) @ ab[0].T) @ ab[1].T)
        return out

    def _qkv(
        self, layer: Any, i: int, x: torch.Tensor, positions: torch.Tensor, groups: Groups
    ) -> tuple[torch.Tensor, ...]:
        attn, prefix = layer.self_attn, f"model.layers.{i}.self_attn."
        h = layer.input_layernorm(x)
        n, length = h.shape[:2]
        q = self._linear(prefix + "q_proj", attn.q_proj, h, groups).view(n, length, self.heads, self.head_dim)
        k = self._linear(prefix + "k_proj", attn.k_proj, h, groups).view(n, length, self.kv_heads, self.head_dim)
        v = self._linear(prefix + "v_proj", attn.v_proj, h, groups).view(n, length, self.kv_heads, self.head_dim)
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = self.inner.rotary_emb(h, positions)  # [n, L, hd]
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def _rest(self, layer: Any, i: int, x: torch.Tensor, attn: torch.Tensor, groups: Groups) -> torch.Tensor:
        prefix = f"model.layers.{i}."
        x = x + self._linear(prefix + "self_attn.o_proj", layer.self_attn.o_proj, attn, groups)
        h = layer.post_attention_layernorm(x)
        mlp = layer.mlp
        gate = self._linear(prefix + "mlp.gate_proj", mlp.gate_proj, h, groups)
        up = self._linear(prefix + "mlp.up_proj", mlp.up_proj, h, groups)
        return x + self._linear(prefix + "mlp.down_proj", mlp.down_proj, mlp.act_fn(gate) * up, groups)

    def _logits(self, hidden: torch.Tensor, groups: Groups) -> torch.Tensor:
        return self._linear("lm_head", self.model.lm_head, self.inner.norm(hidden), groups)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _is_plain_layer(layer: Any) -> bool:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")) and all(
        hasattr(mlp, p) for p in ("gate_proj", "up_proj", "down_proj", "act_fn")
    )
