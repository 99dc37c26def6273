"""RL's Razor's predictor on slime: KL(current ‖ the stage's starting policy) on the earlier domains' eval samples.

On the local backend both policies score the check's episodes in process, summed over the vocabulary. On
slime neither is at hand in the eval hook: the samples carry only the current policy's log-probs of their
own tokens (``rollout_log_probs``, from SGLang), and slime's reference model scores training batches only.
So the starting policy's log-probs of the same tokens come from the same SGLang engine, through its real
prompt-scoring route (``/generate`` with ``input_ids`` = prompt + response, ``max_new_tokens: 0``,
``return_logprob``, ``logprob_start_len``; :func:`aclarena_slime.distill.mopd.score_response`, which
MOPD's teachers use), served as the base model (``lora_path`` None: a LoRA stage's adapter starts from
the base) or as a loaded adapter. The KL is then estimated from the samples themselves: with
``r = p_start(y) / p_current(y)`` for each response token ``y`` the current policy sampled,
``E[r - 1 - log r]`` is KL(current ‖ start) at that position, and never negative (Schulman's k3; slime's
``low_var_kl``). Only loss-mask tokens count (a tool's observation is not the model's).

Full fine-tuning has no servable starting policy: SGLang holds only the weights being trained. The
compiler then writes no reference and the monitor says so in its log and report.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aclarena_slime.distill.mopd import Teacher, score_response
from aclarena_slime.kl import approx_kl
from aclarena_slime.sglang_client import SGLangClient

CONCURRENCY = 32  # scoring requests in flight: prefill only, a small share of the engine next to the eval itself
FULL_FT_REASON = (
    "KL predictor not computed on slime for full fine-tuning: SGLang serves only the weights being trained, "
    "not the stage's starting checkpoint"
)


@dataclass(frozen=True)
class KlReference:
    """Where the stage's starting policy is served: the engine's base model (``lora_path`` None) or an adapter."""

    lora_path: str | None = None

    @classmethod
    def from_section(cls, value: Any) -> KlReference | None:
        """The monitor section's ``kl_reference``: a mapping, or None where the policy is not servable."""
        if value is None:
            return None
        if not isinstance(value, Mapping) or set(value) - {"lora_path"}:
            raise ValueError(f"aclarena_monitor.kl_reference must be null or {{lora_path: name|null}}, got {value!r}")
        lora_path = value.get("lora_path")
        if lora_path is not None and not isinstance(lora_path, str):
            raise ValueError(f"aclarena_monitor.kl_reference.lora_path must be an adapter name, got {lora_path!r}")
        return cls(lora_path)


def sampled_kl(
    current: Sequence[Sequence[float]], start: Sequence[Sequence[float]], masks: Sequence[Sequence[int]]
) -> float:
    """Mean k3 estimate of KL(current ‖ start) per loss-mask token, from both policies' log-probs of the
    tokens the current policy sampled; NaN with no token to count."""
    import torch

    total, tokens = 0.0, 0
    for i, (cur, ref, mask) in enumerate(zip(current, start, masks, strict=True)):
        if not len(cur) == len(ref) == len(mask):
            raise ValueError(
                f"sample {i}: {len(cur)} current, {len(ref)} starting log-probs and {len(mask)} mask values"
            )
        keep = torch.tensor([float(m) for m in mask], dtype=torch.float64)
        kl = approx_kl(torch.tensor(cur, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64), "k3")
        total += float((kl * keep).sum())
        tokens += int(keep.count_nonzero())
    return total / tokens if tokens else math.nan


async def _score_all(url: str, reference: KlReference, samples: Sequence[Any], temperature: float) -> list[list[float]]:
    client = SGLangClient(url)
    teacher = Teacher(url, reference.lora_path)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(sample: Any) -> list[float]:
        async with gate:
            return await score_response(client, teacher, sample, temperature)

    return list(await asyncio.gather(*(one(s) for s in samples)))


def domain_kl(url: str, reference: KlReference, samples: Sequence[Any], temperature: float) -> float:
    """KL(current ‖ start) over ``samples`` (slime ``Sample``\\ s of one eval dataset, sampled at
    ``temperature``): the starting policy scored by the engine at ``url``, the current one read from the samples."""
    usable = [s for s in samples if s.rollout_log_probs is not None and int(s.response_length) > 0]
    if not usable:
        return math.nan
    start = asyncio.run(_score_all(url, reference, usable, temperature))
    current = [[float(x) for x in s.rollout_log_probs] for s in usable]
    masks = [list(s.loss_mask) if s.loss_mask is not None else [1] * int(s.response_length) for s in usable]
    return sampled_kl(current, start, masks)
