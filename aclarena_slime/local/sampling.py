"""Next tokens for a whole batch at once, each row from its own reproducible random stream.

A row's randomness depends only on its seed, how many tokens it has drawn and the token id (a
counter-based hash, as Philox-style generators are), never on which rows share the batch. The draw
is Gumbel-max: the token with the largest ``logits / T + Gumbel noise`` among those top-k/top-p keep,
which is an exact sample of that distribution. Unlike an inverse-CDF draw, whose token changes when
a cumulative sum moves by a rounding error, it changes only when two noisy scores are within
rounding of each other: a batch's float32 rounding (which differs from one batch size to another)
practically never changes a seeded request's tokens. The reported log-prob is
``log_softmax(logits / T)`` at the drawn token, before filtering, as SGLang reports it (temperature 0
counts as 1, and picks the argmax).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

_M32 = 0xFFFFFFFF


def _mix(x: int) -> int:
    """A 32-bit integer hash (xorshift-multiply, "lowbias32")."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _mix_tensor(x: torch.Tensor) -> torch.Tensor:
    """The same kind of hash on int64 tensors below 2**32 (multipliers below 2**31: no int64 overflow)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & _M32
    return x ^ (x >> 16)


def row_key(seed: int, step: int) -> int:
    """The 32-bit key of draw ``step`` of the stream ``seed`` (a 64-bit integer)."""
    return _mix(_mix(_mix((step + 0x9E3779B9) & _M32) ^ (seed >> 32) & _M32) ^ seed & _M32)


@lru_cache(maxsize=4)
def _token_keys(vocab: int) -> torch.Tensor:
    return torch.tensor([_mix(t ^ 0x632BE5AB) for t in range(vocab)], dtype=torch.int64)


def gumbel(seeds: Sequence[int], steps: Sequence[int], vocab: int) -> torch.Tensor:
    """Gumbel noise [rows, vocab], a function of each row's (seed, step) and the token id only."""
    keys = torch.tensor([row_key(s, t) for s, t in zip(seeds, steps, strict=True)], dtype=torch.int64)
    bits = _mix_tensor(keys.unsqueeze(1) ^ _token_keys(vocab)) >> 8  # 24 bits: exact in float32, never 0 or 1
    u = (bits.float() + 0.5) * 2.0**-24
    return u.log_().neg_().log_().neg_()


def sample(
    logits: torch.Tensor,
    temperatures: Sequence[float],
    top_ps: Sequence[float],
    top_ks: Sequence[int],
    seeds: Sequence[int],
    steps: Sequence[int],
) -> tuple[list[int], list[float]]:
    """Draw one token per row of ``logits`` [n, V]; return the tokens and their reported log-probs."""
    logits = logits.float()
    vocab = logits.shape[1]
    temps = torch.tensor(temperatures, dtype=torch.float32)
    greedy = temps == 0
    scaled = logits / torch.where(greedy, 1.0, temps).unsqueeze(1)
    log_probs = torch.log_softmax(scaled, dim=-1)
    any_greedy, all_greedy = bool(greedy.any()), bool(greedy.all())
    tokens = torch.argmax(logits, dim=-1) if any_greedy else None
    if not all_greedy:
        scores = gumbel(seeds, steps, vocab).add_(log_probs)
        if any(p < 1.0 for p in top_ps) or any(0 < k < vocab for k in top_ks):
            probs, order = torch.sort(log_probs.exp(), dim=-1, descending=True)
            ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_ks]).unsqueeze(1)
            before = probs.cumsum(-1) - probs  # mass of the more likely tokens
            drop = (torch.arange(vocab) >= ks) | (before >= torch.tensor(top_ps).unsqueeze(1))
            drop[:, 0] = False
            scores.scatter_(1, order, scores.gather(1, order).masked_fill(drop, float("-inf")))
        drawn = torch.argmax(scores, dim=-1)
        tokens = drawn if tokens is None else torch.where(greedy, tokens, drawn)
    chosen = log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens.tolist(), chosen.tolist()
