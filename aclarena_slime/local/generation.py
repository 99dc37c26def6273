"""Sampling from one frozen causal LM with several named LoRA adapters on top (transformers + PEFT, CPU).

No HTTP here: :mod:`.engine` serves this over SGLang's protocol. One request at a time, token by
token with a KV cache. The log-prob reported for each token is ``log_softmax(logits / T)`` at that
token, before top-p/top-k filtering, as SGLang reports it and as :func:`token_log_probs` lets the
trainer recompute it (slime also divides the logits by the rollout temperature). With top_p=1 and
top_k off that is exactly the distribution the token was drawn from.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aclarena_slime.experts import validate_adapter_name

# Passing the KV cache as ``past_key_values`` keeps this working on the older transformers of slime's
# image; newer releases warn about the name on every forward.
warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)

STOP, LENGTH, ABORT = "stop", "length", "abort"
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default


class GenerationError(ValueError):
    """A request the engine cannot serve as asked (the message says which field)."""


class UnknownAdapter(GenerationError):
    pass


@dataclass(frozen=True)
class SamplingParams:
    """The SGLang sampling parameters the engine honours; others are refused, not silently ignored."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    sampling_seed: int | None = None

    # Accepted and without effect here: they only shape SGLang's text output or its scheduling.
    _IGNORED = frozenset({"no_stop_trim", "skip_special_tokens", "spaces_between_special_tokens", "n", "min_p"})

    @classmethod
    def from_request(cls, raw: Any) -> SamplingParams:
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise GenerationError("sampling_params must be an object")
        known = {
            "temperature",
            "top_p",
            "top_k",
            "max_new_tokens",
            "stop",
            "stop_token_ids",
            "ignore_eos",
            "sampling_seed",
        }
        unknown = sorted(set(raw) - known - cls._IGNORED)
        if unknown:
            raise GenerationError(f"unsupported sampling_params {unknown}; the local engine knows {sorted(known)}")
        if raw.get("n", 1) != 1:
            raise GenerationError("sampling_params.n must be 1 on the local engine (send one request per sample)")
        try:
            stop = raw.get("stop") or ()
            stop = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)
            params = cls(
                temperature=float(raw.get("temperature", 1.0)),
                top_p=float(raw.get("top_p", 1.0)),
                top_k=int(raw.get("top_k", -1)),
                max_new_tokens=int(raw.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)),
                stop=tuple(s for s in stop if s),
                stop_token_ids=tuple(int(t) for t in raw.get("stop_token_ids") or ()),
                ignore_eos=bool(raw.get("ignore_eos", False)),
                sampling_seed=None if raw.get("sampling_seed") is None else int(raw["sampling_seed"]),
            )
        except (TypeError, ValueError) as exc:
            raise GenerationError(f"bad sampling_params: {exc}") from exc
        if params.temperature < 0:
            raise GenerationError(f"temperature must be >= 0, got {params.temperature}")
        if not 0.0 < params.top_p <= 1.0:
            raise GenerationError(f"top_p must be in (0, 1], got {params.top_p}")
        if params.max_new_tokens < 0:
            raise GenerationError(f"max_new_tokens must be >= 0, got {params.max_new_tokens}")
        return params


@dataclass
class Generation:
    output_ids: list[int]
    log_probs: list[float]
    finish: dict[str, Any]  # SGLang's shape: {"type": "stop", "matched": ...} / {"type": "length", ...}


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs of ``tokens`` under ``logits`` as the engine reports them (temperature 0 counts as 1)."""
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """Draw the next token from one row of logits; return it with its reported log-prob."""
    logits = logits.float()
    if params.temperature == 0:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, -1)[token])
    scaled = logits / params.temperature
    log_probs = torch.log_softmax(scaled, -1)
    filtered = scaled.clone()
    if 0 < params.top_k < filtered.numel():
        kth = torch.topk(filtered, params.top_k).values[-1]
        filtered[filtered < kth] = float("-inf")
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(filtered, descending=True)
        cumulative = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, -1) >= params.top_p  # keep the token that crosses top_p
        filtered[order[drop]] = float("-inf")
    token = int(torch.multinomial(torch.softmax(filtered, -1), 1, generator=generator))
    return token, float(log_probs[token])


class MultiLoraModel:
    """One frozen model, any number of named adapters, one generation at a time (thread-safe)."""

    def __init__(self, model: Any, tokenizer: Any, seed: int = 0) -> None:
        self.base = model.eval()
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.peft: Any = None  # a PeftModel once the first adapter is loaded
        self.adapters: dict[str, str] = {}
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.eos_ids = _eos_ids(model, tokenizer)
        self._lock = threading.Lock()
        self._generator = torch.Generator().manual_seed(seed)
        self.closing = False

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, seed: int = 0) -> MultiLoraModel:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        return cls(model, tokenizer, seed=seed)

    @property
    def vocab_size(self) -> int:
        return int(self.base.get_output_embeddings().weight.shape[0])

    def load_adapter(self, name: str, path: str | Path) -> None:
        """Load a PEFT adapter directory under ``name``; a name already loaded must be unloaded first."""
        from peft import PeftModel

        validate_adapter_name(name)
        path = Path(path)
        if not (path / "adapter_config.json").is_file():
            raise GenerationError(f"{path} is not a PEFT adapter directory (no adapter_config.json)")
        with self._lock:
            if name in self.adapters:
                raise GenerationError(f"adapter {name!r} is already loaded; unload it first (SGLang's protocol)")
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.base, str(path), adapter_name=name, is_trainable=False)
            else:
                self.peft.load_adapter(str(path), adapter_name=name, is_trainable=False)
            self.peft.eval()
            self.adapters[name] = str(path)

    def unload_adapter(self, name: str) -> None:
        with self._lock:
            if name not in self.adapters:
                raise UnknownAdapter(f"adapter {name!r} is not loaded; loaded: {sorted(self.adapters) or 'none'}")
            self.peft.delete_adapter(name)
            del self.adapters[name]

    @contextlib.contextmanager
    def _using(self, adapter: str | None) -> Iterator[Any]:
        if adapter is None:
            if self.peft is None:
                yield self.base
            else:
                with self.peft.disable_adapter():
                    yield self.peft
            return
        if adapter not in self.adapters:
            raise UnknownAdapter(f"adapter {adapter!r} is not loaded; loaded: {sorted(self.adapters) or 'none'}")
        self.peft.set_adapter(adapter)
        yield self.peft

    def generate(
        self,
        input_ids: Sequence[int],
        params: SamplingParams,
        adapter: str | None = None,
        aborted: Callable[[], bool] | None = None,
    ) -> Generation:
        """Sample a continuation of ``input_ids``; blocks while another generation runs.

        ``aborted`` is polled before each token (SGLang's ``/abort_request``): when it says so, the
        tokens so far come back with finish reason ``abort``.
        """
        from transformers import DynamicCache

        ids = [int(t) for t in input_ids]
        if not ids:
            raise GenerationError("input_ids is empty")
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise GenerationError(f"input_ids must be token ids in [0, {self.vocab_size})")
        budget = params.max_new_tokens
        if self.max_positions is not None:
            if len(ids) >= self.max_positions:
                raise GenerationError(f"prompt of {len(ids)} tokens exceeds the context of {self.max_positions}")
            budget = min(budget, self.max_positions - len(ids))
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids)
        generator = (
            torch.Generator().manual_seed(params.sampling_seed) if params.sampling_seed is not None else self._generator
        )
        out: list[int] = []
        log_probs: list[float] = []
        with self._lock, torch.inference_mode(), self._using(adapter) as model:
            if budget <= 0:
                return Generation([], [], {"type": LENGTH, "length": 0})
            cache = DynamicCache()
            logits = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True).logits[0, -1]
            while True:
                if self.closing:
                    return Generation(out, log_probs, {"type": ABORT, "message": "the engine is shutting down"})
                if aborted is not None and aborted():
                    return Generation(out, log_probs, {"type": ABORT, "message": "aborted by /abort_request"})
                token, log_prob = sample_token(logits, params, generator)
                out.append(token)
                log_probs.append(log_prob)
                if token in stop_ids:
                    return Generation(out, log_probs, {"type": STOP, "matched": token})
                matched = self._stop_string(out, params.stop)
                if matched is not None:
                    return Generation(out, log_probs, {"type": STOP, "matched": matched})
                if len(out) >= budget:
                    return Generation(out, log_probs, {"type": LENGTH, "length": len(out)})
                step = torch.tensor([[token]])
                logits = model(input_ids=step, past_key_values=cache, use_cache=True).logits[0, -1]

    def _stop_string(self, out: list[int], stops: tuple[str, ...]) -> str | None:
        if not stops:
            return None
        # A stop string spans a few tokens at most; decoding the tail keeps this cheap on long outputs.
        tail = self.tokenizer.decode(out[-max(len(s) for s in stops) - 4 :], skip_special_tokens=False)
        for stop in stops:
            if stop in tail:
                return stop
        return None

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return ids
