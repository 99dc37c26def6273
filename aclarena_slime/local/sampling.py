"""Next tokens for a whole batch at once, each row from its own reproducible random stream.

A row's randomness depends only on its seed and how many tokens it has drawn (a counter-based
hash, as Philox-style generators do), never on which rows share the batch: a seeded request draws
the same tokens alone or among 64. Sampling is by inverse CDF over the (top-k/top-p filtered)
probabilities, so one uniform per row per step is all the randomness needed. The reported log-prob
is ``log_softmax(logits / T)`` at the drawn token, before filtering, as SGLang reports it (temperature
0 counts as 1, and picks the argmax).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_M32 = 0xFFFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply) on int64 values below 2**32; products stay below 2**63."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & _M32
    return x ^ (x >> 16)


def uniforms(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One uniform in (0, 1) per row from its 64-bit ``seeds`` (int64) and draw counter ``steps``."""
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    h = _mix(_mix(_mix((steps + 0x9E3779B9) & _M32) ^ hi) ^ lo)
    return (h.double() + 0.5) / 2.0**32


def sample(
    logits: torch.Tensor,
    temperatures: Sequence[float],
    top_ps: Sequence[float],
    top_ks: Sequence[int],
    seeds: torch.Tensor,
    steps: torch.Tensor,
) -> tuple[list[int], list[float]]:
    """Draw one token per row of ``logits`` [n, V]; return the tokens and their reported log-probs."""
    logits = logits.float()
    vocab = logits.shape[1]
    temps = torch.tensor(temperatures, dtype=torch.float32)
    greedy = temps == 0
    scaled = logits / torch.where(greedy, 1.0, temps).unsqueeze(1)
    log_probs = torch.log_softmax(scaled, dim=-1)
    tokens = torch.argmax(logits, dim=-1)
    if not bool(greedy.all()):
        u = uniforms(seeds, steps).unsqueeze(1)
        filtered = any(p < 1.0 for p in top_ps) or any(0 < k < vocab for k in top_ks)
        if filtered:
            probs, order = torch.sort(log_probs.exp(), dim=-1, descending=True)
            ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_ks]).unsqueeze(1)
            before = probs.cumsum(-1) - probs  # mass of the more likely tokens
            keep = (torch.arange(vocab) < ks) & (before < torch.tensor(top_ps).unsqueeze(1))
            keep[:, 0] = True
            probs = probs * keep
        else:
            probs, order = log_probs.exp(), None
        cdf = probs.double().cumsum(-1)
        drawn = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=vocab - 1).squeeze(1)
        if order is not None:
            drawn = order.gather(1, drawn.unsqueeze(1)).squeeze(1)
        tokens = torch.where(greedy, tokens, drawn)
    chosen = log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens.tolist(), chosen.tolist()
