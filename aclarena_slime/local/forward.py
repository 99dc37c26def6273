"""One forward for a whole batch of sequences: a minimal decoder pass over a Hugging Face model's weights.

Transformers' generic path costs more Python per step than the tiny models' arithmetic, and its
caches are one tensor per batch, so sequences cannot join or leave it. This pass reads the same
weights (Llama/Qwen2/Qwen3-shaped decoders: ``model.layers[i].self_attn.{q,k,v,o}_proj``,
``mlp.{gate,up,down}_proj``, optional ``q_norm``/``k_norm``) and keeps a padded KV cache with one row
(slot) per sequence: a prefill runs new prompts packed (real tokens only) and writes their rows, a
decode step appends one token to every live row and attends up to the longest row under a mask of
each row's length. LoRA adapters are applied to each adapter's contiguous run of rows (the engine
keeps them contiguous): ``x[run] @ A.T @ B.T`` added to those rows, nothing for rows on the base model
(measurements in ``docs/local-engine.md``).
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
MODEL_TYPES = ("llama", "qwen2", "qwen3")  # decoders whose layers this pass reproduces exactly
CACHE_CHUNK = 64  # the KV cache grows (and shrinks) by this many positions


class UnsupportedModel(ValueError):
    """A model or adapter this forward cannot run exactly (the message says what)."""


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one object per loaded adapter
class LoraWeights:
    """One adapter: ``module path -> (A.T [in, r], (B * scaling).T [r, out])``, ready to right-multiply."""

    layers: dict[str, tuple[torch.Tensor, torch.Tensor]]
    rank: int

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
            out[module] = (a.float().T.contiguous(), (b.float() * scaling).T.contiguous())
        if not out:
            raise UnsupportedModel(f"{path}: no LoRA weights found")
        return cls(out, rank)


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    if (path / "adapter_model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(path / "adapter_model.safetensors"))
    if (path / "adapter_model.bin").is_file():
        return torch.load(path / "adapter_model.bin", map_location="cpu", weights_only=True)
    raise UnsupportedModel(f"{path}: no adapter_model.safetensors or adapter_model.bin")


class LoraBatch:
    """The adapters of a batch's rows, applied to each run of consecutive rows on one adapter.

    The engine keeps the rows of each adapter contiguous (see ``MultiLoraModel``), so a batch is a few
    runs: each adapter's update is two matmuls over its own rows per fused projection (q/k/v together,
    gate/up together: ``A`` side by side, ``B`` block-diagonal), and rows on the base model cost
    nothing. On CPU that measured faster than a 0/1 mask over every row's rank columns and than a
    per-row gather of the adapter weights (``docs/local-engine.md``).
    """

    def __init__(self, segments: list[tuple[int, int, LoraWeights]], stacks: dict) -> None:
        self.segments, self._stacks = segments, stacks

    def apply(
        self, names: tuple[str, ...], widths: tuple[int, ...], x: torch.Tensor, out: torch.Tensor
    ) -> torch.Tensor:
        """Add the update of projections ``names`` (of input ``x`` [rows, in]) to ``out``, their outputs side by side."""
        for first, end, lora in self.segments:
            key = (lora, names)
            if key not in self._stacks:
                self._stacks[key] = _stack(lora, names, widths, x.shape[-1])
            stack = self._stacks[key]
            if stack is not None:
                out[first:end].addmm_(x[first:end] @ stack[0], stack[1])
        return out


def _stack(
    lora: LoraWeights, names: tuple[str, ...], widths: tuple[int, ...], d_in: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``A`` [in, k*r] and block-diagonal ``B`` [k*r, sum of widths] of one adapter on k projections."""
    if all(name not in lora.layers for name in names):
        return None
    a = torch.zeros(d_in, lora.rank * len(names))
    b = torch.zeros(lora.rank * len(names), sum(widths))
    column = 0
    for j, (name, width) in enumerate(zip(names, widths, strict=True)):
        ab = lora.layers.get(name)
        if ab is not None:
            a[:, j * lora.rank : (j + 1) * lora.rank] = ab[0]
            b[j * lora.rank : (j + 1) * lora.rank, column : column + width] = ab[1]
        column += width
    return a, b


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

    def move(self, src: list[int], dst: list[int]) -> None:
        """Copy rows ``src`` over rows ``dst`` (all read before any is written)."""
        source, target = torch.tensor(src), torch.tensor(dst)
        for t in self.k + self.v:
            t.index_copy_(0, target, t.index_select(0, source))

    def clear(self) -> None:
        self.k, self.v, self.capacity = [], [], 0


class BatchForward:
    """The decoder pass over ``model``'s own modules (no copies of the weights)."""

    def __init__(self, model: Any) -> None:
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        config = model.config
        if config.model_type not in MODEL_TYPES or layers is None or not all(map(_is_plain_layer, layers)):
            raise UnsupportedModel(f"the local engine runs {MODEL_TYPES} decoders; {type(model).__name__} is not one")
        if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
            raise UnsupportedModel("the local engine runs full attention only (no sliding window)")
        self.model, self.inner, self.layers = model, inner, list(layers)
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.scaling = float(attn.scaling)
        self._stacks: dict = {}  # (adapter, projections) -> its stacked LoRA weights, see LoraBatch
        # q/k/v and gate/up as one matmul each; the modules' weights become views of the fused ones.
        self.fused = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.fused.append((_fuse([attn.q_proj, attn.k_proj, attn.v_proj]), _fuse([mlp.gate_proj, mlp.up_proj])))
        self.linears: dict[str, torch.nn.Linear] = {
            name: module
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LORA_TARGETS
        }

    def new_cache(self, slots: int) -> KVCache:
        return KVCache(len(self.layers), slots, self.kv_heads, self.head_dim)

    def lora_batch(self, adapters: Sequence[LoraWeights | None]) -> LoraBatch:
        """The LoRA update of activations [rows, features] whose rows are on ``adapters`` (None: the base model)."""
        segments, start = [], 0
        for row in range(1, len(adapters) + 1):
            if row == len(adapters) or adapters[row] is not adapters[start]:
                if adapters[start] is not None:
                    segments.append((start, row, adapters[start]))
                start = row
        return LoraBatch(segments, self._stacks)

    def forget(self, lora: LoraWeights) -> None:
        """Drop the stacked weights of an adapter being unloaded."""
        for key in [k for k in list(self._stacks) if k[0] is lora]:  # list(): the worker may add one meanwhile
            self._stacks.pop(key, None)

    def prefill(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        cache: KVCache,
        slots: torch.Tensor,
        adapters: Sequence[LoraWeights | None],
        first: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Run right-padded prompts ``ids`` [n, L] into cache rows ``slots`` [n]; logits at each prompt's end.

        With ``first``, the logits of each prompt's positions ``first[i] .. lengths[i] - 1`` instead, the
        prompts' one after another (its last row is still the prompt's end): prompt scoring reads the
        log-probs of the prompt's own tokens from them, and the other prompts pay nothing for it.

        The projections run over the prompts' real tokens only, packed into [tokens, hidden]: prompts
        of varied length padded to the longest are mostly padding (45% for the benchmark's 64), and
        the projections are nearly all of a prefill's arithmetic. Attention runs per group of prompts
        of similar length (``_length_groups``), each padded to its own longest under the causal mask
        (which keeps every real position off the padding after it): a GRPO step's samples of one
        prompt share a length and pad nothing, and no prompt pads to the batch's longest.
        """
        n, length = ids.shape
        index = (torch.arange(length) < lengths.unsqueeze(1)).flatten().nonzero().squeeze(1)  # packed -> padded
        x = self.inner.embed_tokens(ids.flatten()[index])  # [tokens, hidden]
        rope = self._rope(x, torch.arange(length).repeat(n)[index].unsqueeze(1))
        counts = lengths.tolist()
        lora = self.lora_batch([a for a, count in zip(adapters, counts, strict=True) for _ in range(count)])
        groups = [_Group(rows, counts, slots) for rows in _length_groups(counts)]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, i, x, rope, lora, (len(index),))
            attn = torch.empty(len(index), self.heads * self.head_dim)
            for group in groups:
                gq, gk, gv = group.padded(q), group.padded(k), group.padded(v)  # [m, heads, l, hd]
                cache.k[i][group.slots, :, : group.length] = gk
                cache.v[i][group.slots, :, : group.length] = gv
                out = F.scaled_dot_product_attention(gq, gk, gv, is_causal=True, scale=self.scaling, enable_gqa=True)
                group.unpad(out.transpose(1, 2).reshape(-1, attn.shape[1]), attn)
            x = self._rest(layer, i, x, attn, lora)
        ends = lengths.cumsum(0)
        if first is None:
            return self._logits(x[ends - 1], self.lora_batch(adapters))
        spans = [(int(end) - count + start, int(end)) for end, count, start in zip(ends, counts, first, strict=True)]
        rows = torch.cat([torch.arange(a, b) for a, b in spans])
        heads = [a for a, (lo, hi) in zip(adapters, spans, strict=True) for _ in range(hi - lo)]
        return self._logits(x[rows], self.lora_batch(heads))

    def decode(self, tokens: torch.Tensor, lengths: torch.Tensor, cache: KVCache, lora: LoraBatch) -> torch.Tensor:
        """One new token for each of the first ``n`` rows, at position ``lengths`` [n]; next-token logits [n, V].

        Attention reads the cache up to the longest row only, not its whole capacity: at 64 rows the
        cache is most of the memory a step reads, and it grows in chunks of ``CACHE_CHUNK``.
        """
        n = tokens.shape[0]
        live = int(lengths.max()) + 1
        # Where each row's new key/value goes in the cache seen as [slots * kv_heads * capacity, head_dim].
        at = ((torch.arange(n) * self.kv_heads).unsqueeze(1) + torch.arange(self.kv_heads)) * cache.capacity
        at = (at + lengths.unsqueeze(1)).flatten()
        x = self.inner.embed_tokens(tokens)  # [n, hidden]
        rope = self._rope(x, lengths.unsqueeze(1))
        # -inf past each row's length, added to the scores (an add measured 3x faster than a broadcast masked_fill_).
        hidden = torch.zeros(n, 1, 1, live).masked_fill_(
            (torch.arange(live) > lengths.unsqueeze(1)).view(n, 1, 1, live), float("-inf")
        )
        group = self.heads // self.kv_heads
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, i, x, rope, lora, (n,))  # [n, heads, hd]
            keys, values = cache.k[i], cache.v[i]
            keys.view(-1, self.head_dim).index_copy_(0, at, k.reshape(-1, self.head_dim))
            values.view(-1, self.head_dim).index_copy_(0, at, v.reshape(-1, self.head_dim))
            q = q.view(n, self.kv_heads, group, self.head_dim)
            scores = torch.matmul(q, keys[:n, :, :live].transpose(-1, -2)).mul_(self.scaling)  # [n, kv, group, live]
            probs = torch.softmax(scores.add_(hidden), dim=-1)
            x = self._rest(layer, i, x, torch.matmul(probs, values[:n, :, :live]).view(n, -1), lora)
        return self._logits(x, lora)

    # --- the layer's pieces ---------------------------------------------------------------------------

    def _linear(self, name: str, module: torch.nn.Linear, x: torch.Tensor, lora: LoraBatch) -> torch.Tensor:
        return lora.apply((name,), (module.out_features,), x, F.linear(x, module.weight, module.bias))

    def _norm(self, norm: Any, x: torch.Tensor) -> torch.Tensor:
        return _rms_scaled(x, norm.variance_epsilon).mul_(norm.weight)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin of ``positions`` [rows, 1], shaped to multiply [rows, heads, head_dim].

        Computed once per forward for every layer. The sin's first half is negated so that the
        rotation is ``x * cos + x.roll(half) * sin`` (``roll`` is transformers' ``rotate_half`` less its sign).
        """
        cos, sin = self.inner.rotary_emb(x, positions)  # [rows, 1, hd]
        half = self.head_dim // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return cos[:, 0].unsqueeze(-2), sin[:, 0].unsqueeze(-2)

    def _qkv(
        self, layer: Any, i: int, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], lora: LoraBatch, lead: tuple
    ) -> tuple[torch.Tensor, ...]:
        attn, prefix = layer.self_attn, f"model.layers.{i}.self_attn."
        h = self._norm(layer.input_layernorm, x)
        qkv = F.linear(h, *self.fused[i][0])
        dq, dk = self.heads * self.head_dim, self.kv_heads * self.head_dim
        names = (prefix + "q_proj", prefix + "k_proj", prefix + "v_proj")
        qkv = lora.apply(names, (dq, dk, dk), h, qkv)
        # q and k side by side as [rows, heads + kv_heads, hd]: one norm scale and one rotation for both.
        qk = qkv[..., : dq + dk].view(*lead, self.heads + self.kv_heads, self.head_dim)
        v = qkv[..., dq + dk :].view(*lead, self.kv_heads, self.head_dim)
        if getattr(attn, "q_norm", None) is not None:
            qk = _rms_scaled(qk, attn.q_norm.variance_epsilon)
            qk[..., : self.heads, :].mul_(attn.q_norm.weight)
            qk[..., self.heads :, :].mul_(attn.k_norm.weight)
        cos, sin = rope
        qk = torch.addcmul(qk * cos, qk.roll(self.head_dim // 2, -1), sin)
        return qk[..., : self.heads, :], qk[..., self.heads :, :], v

    def _rest(self, layer: Any, i: int, x: torch.Tensor, attn: torch.Tensor, lora: LoraBatch) -> torch.Tensor:
        prefix = f"model.layers.{i}."
        x = x + self._linear(prefix + "self_attn.o_proj", layer.self_attn.o_proj, attn, lora)
        h = self._norm(layer.post_attention_layernorm, x)
        mlp = layer.mlp
        gate_up = F.linear(h, *self.fused[i][1])
        width = mlp.gate_proj.out_features
        names = (prefix + "mlp.gate_proj", prefix + "mlp.up_proj")
        gate_up = lora.apply(names, (width, width), h, gate_up)
        gate, up = gate_up[..., :width], gate_up[..., width:]
        return x + self._linear(prefix + "mlp.down_proj", mlp.down_proj, mlp.act_fn(gate) * up, lora)

    def _logits(self, hidden: torch.Tensor, lora: LoraBatch) -> torch.Tensor:
        return self._linear("lm_head", self.model.lm_head, self._norm(self.inner.norm, hidden), lora)


def _fuse(modules: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for projections of the same input; each module keeps a view of its rows."""
    weight = torch.cat([m.weight.detach() for m in modules])
    bias = None
    if any(m.bias is not None for m in modules):
        bias = torch.cat([m.bias.detach() if m.bias is not None else torch.zeros(m.out_features) for m in modules])
    start = 0
    for m in modules:
        end = start + m.out_features
        m.weight = torch.nn.Parameter(weight[start:end], requires_grad=False)
        if m.bias is not None:
            m.bias = torch.nn.Parameter(bias[start:end], requires_grad=False)
        start = end
    return weight, bias


def _rms_scaled(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x)`` over the last dimension (RMSNorm before its weight), as a new tensor.

    The mean square comes from ``vector_norm``: ``F.rms_norm`` (pow, mean, rsqrt, two muls) measured
    several times slower on a prefill's [3,000, 256] and about the same on a 64-row step, for a
    difference of an ulp or two (``docs/local-engine.md``).
    """
    square = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1])
    return x * square.add_(eps).rsqrt_()


def _length_groups(lengths: list[int]) -> list[list[int]]:
    """Prompts (indices into ``lengths``) grouped so that each group's shortest is at least 7/8 of its longest.

    A prefill's attention pads each group to its longest, so padding stays under 1/8 of a group while
    the number of groups (one attention call each per layer) stays small: 14-84 tokens give at most 14.
    """
    groups: list[list[int]] = []
    for j in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        if groups and 8 * lengths[j] >= 7 * lengths[groups[-1][0]]:
            groups[-1].append(j)
        else:
            groups.append([j])
    return groups


class _Group:
    """Where one group of a packed prefill's prompts sits: its packed tokens, their padded places, its cache rows."""

    def __init__(self, rows: list[int], lengths: list[int], slots: torch.Tensor) -> None:
        starts = [0]
        for count in lengths[:-1]:
            starts.append(starts[-1] + count)
        self.rows, self.length = len(rows), lengths[rows[0]]
        self.slots = slots[rows]
        self.tokens = torch.cat([torch.arange(starts[j], starts[j] + lengths[j]) for j in rows])
        places = [r * self.length + torch.arange(lengths[j]) for r, j in enumerate(rows)]
        self.places = None if len(self.tokens) == self.rows * self.length else torch.cat(places)

    def padded(self, t: torch.Tensor) -> torch.Tensor:
        """This group's rows of packed ``t`` [tokens, heads, hd], padded: [rows, heads, length, hd]."""
        mine = t.index_select(0, self.tokens)
        if self.places is not None:
            mine = mine.new_zeros(self.rows * self.length, *t.shape[1:]).index_copy_(0, self.places, mine)
        return mine.view(self.rows, self.length, *t.shape[1:]).transpose(1, 2)

    def unpad(self, t: torch.Tensor, out: torch.Tensor) -> None:
        """Write this group's padded rows ``t`` [rows * length, features] into packed ``out``."""
        out.index_copy_(0, self.tokens, t if self.places is None else t.index_select(0, self.places))


def _is_plain_layer(layer: Any) -> bool:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")) and all(
        hasattr(mlp, p) for p in ("gate_proj", "up_proj", "down_proj", "act_fn")
    )
