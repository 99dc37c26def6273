"""Where the entropy analysis gets its distributions: a local transformers model, or saved SGLang top-k.

Sequences (the same for every checkpoint) come from a JSONL file, one per line, either
``{"prompt_ids": [...], "response_ids": [...], "loss_mask": [...]}`` — what ``aclarena eval run``
writes per sample; only positions with mask 1, the model's own tokens, are analysed — or
``{"prompt": "...", "response": "..."}`` texts, tokenized with the first checkpoint's tokenizer.

Saved top-k: one JSONL file per checkpoint, lines ``{"id": ..., "top_logprobs": [[[logprob, token_id,
text], ...] per analysed position]}`` (SGLang's ``meta_info.input_top_logprobs`` /
``output_top_logprobs`` layout; a line holding a whole SGLang answer is read from its ``meta_info``,
dropping the leading ``None`` of ``input_top_logprobs``). Lines are matched by ``id`` across files.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from aclarena_slime.analysis.entropy import EntropyError, TokenStats, stats_from_logits, stats_from_top_logprobs
from aclarena_slime.jsonl import JsonlError, iter_jsonl


@dataclass(frozen=True)
class TokenSequence:
    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[int]

    def positions(self) -> list[int]:
        """Indices into ``prompt_ids + response_ids`` of the analysed (model-written) tokens."""
        start = len(self.prompt_ids)
        return [start + i for i, m in enumerate(self.mask) if m]


def _jsonl(path: Path, limit: int | None = None) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for the first ``limit`` records; any bad line is an EntropyError."""
    try:
        return list(islice(iter_jsonl(path), limit))
    except JsonlError as exc:
        raise EntropyError(str(exc)) from None
    except OSError as exc:
        raise EntropyError(f"cannot read {path}: {exc}") from exc


def read_sequences(path: str | Path, tokenizer: Any = None, limit: int | None = None) -> list[TokenSequence]:
    sequences = []
    for number, record in _jsonl(Path(path), limit):
        if "response_ids" in record:
            response = [int(t) for t in record["response_ids"]]
            mask = [int(m) for m in record.get("loss_mask") or [1] * len(response)]
            prompt = [int(t) for t in record.get("prompt_ids") or []]
        elif "response" in record:
            if tokenizer is None:
                raise EntropyError(f"{path}:{number}: text records need a tokenizer")
            prompt = list(tokenizer.encode(str(record.get("prompt", "")), add_special_tokens=False))
            response = list(tokenizer.encode(str(record["response"]), add_special_tokens=False))
            mask = [1] * len(response)
        else:
            raise EntropyError(f"{path}:{number}: needs response_ids (and prompt_ids) or prompt/response texts")
        if len(mask) != len(response):
            raise EntropyError(f"{path}:{number}: loss_mask has {len(mask)} entries for {len(response)} tokens")
        if not prompt:
            raise EntropyError(f"{path}:{number}: an empty prompt leaves the first token without a distribution")
        sequences.append(TokenSequence(prompt, response, mask))
    if not sequences:
        raise EntropyError(f"{path} holds no sequences")
    return sequences


def load_causal_lm(path: str | Path) -> Any:
    """A transformers causal LM in float32 on CPU; a PEFT adapter folder loads on its base model."""
    path = Path(path)
    if (path / "adapter_config.json").exists():
        from peft import AutoPeftModelForCausalLM

        return AutoPeftModelForCausalLM.from_pretrained(path, torch_dtype="float32").eval()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, torch_dtype="float32").eval()


def model_stats(model: Any, sequences: list[TokenSequence]) -> TokenStats:
    """Entropy and top choice of ``model`` at every analysed position (logits at ``p - 1`` predict ``p``)."""
    import torch

    parts = []
    with torch.no_grad():
        for seq in sequences:
            positions = seq.positions()
            if not positions:
                continue
            ids = torch.tensor([seq.prompt_ids + seq.response_ids])
            logits = model(input_ids=ids).logits[0]
            parts.append(stats_from_logits(logits[torch.tensor(positions) - 1]))
    return TokenStats.concat(parts)


def read_top_logprobs(path: str | Path) -> dict[str, list[list[list[Any]]]]:
    """``id -> per-position top-k lists`` from one checkpoint's file."""
    out = {}
    for index, (number, record) in enumerate(_jsonl(Path(path))):
        key = str(record.get("id", index))
        if "top_logprobs" in record:
            positions = record["top_logprobs"]
        else:
            meta = record.get("meta_info") or {}
            positions = meta.get("output_top_logprobs") or [p for p in meta.get("input_top_logprobs") or [] if p]
        if not isinstance(positions, list) or not positions:
            raise EntropyError(f"{path}:{number}: no top_logprobs (or meta_info.*_top_logprobs) in record {key!r}")
        out[key] = positions
    return out


def top_logprob_stats(paths: list[str | Path]) -> list[TokenStats]:
    """One ``TokenStats`` per checkpoint file, over the ids every file has, in the first file's order."""
    tables = [read_top_logprobs(p) for p in paths]
    ids = [k for k in tables[0] if all(k in t for t in tables[1:])]
    if not ids:
        raise EntropyError("the top-k files share no record id")
    for key in ids:
        lengths = {len(t[key]) for t in tables}
        if len(lengths) > 1:
            raise EntropyError(f"record {key!r} covers different numbers of positions across files: {sorted(lengths)}")
    return [TokenStats.concat([stats_from_top_logprobs(t[k]) for k in ids]) for t in tables]
