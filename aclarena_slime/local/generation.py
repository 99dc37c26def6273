"""Sampling from one frozen causal LM with several named LoRA adapters on top, every request in one batch.

No HTTP here: :mod:`.engine` serves this over SGLang's protocol. Requests join a running batch as
they arrive (one batched prefill) and leave it as they finish (EOS, stop token or string,
``max_new_tokens``, abort; a prompt only scored, ``max_new_tokens`` 0, right after its prefill); each
step is one forward of :class:`~.forward.BatchForward` for all of them, each row on its own adapter.
The log-prob reported for each token is ``log_softmax(logits / T)`` at that token, before
top-p/top-k filtering, as SGLang reports it and as :func:`token_log_probs` lets the trainer recompute
it (slime also divides the logits by the rollout temperature). With top_p=1 and top_k off that is exactly the distribution the token was drawn from.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aclarena_slime.adapter_swap import AdapterSwapError, split_version, verify_checksum
from aclarena_slime.experts import validate_adapter_name
from aclarena_slime.local.config import EngineSettings
from aclarena_slime.local.forward import BatchForward, KVCache, LoraWeights, UnsupportedModel
from aclarena_slime.local.sampling import sample

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
    # With ``logprob_start`` K: the log-probs of prompt tokens K+1 .. end, each given the tokens before it.
    input_log_probs: list[float] = field(default_factory=list)


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs of ``tokens`` under ``logits`` as the engine reports them (temperature 0 counts as 1)."""
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class Request:
    """One request in the engine: set ``aborted`` to stop it at its next step; ``future`` gets the result."""

    __slots__ = (
        "ids",
        "params",
        "adapter",
        "budget",
        "stop_ids",
        "seed",
        "out",
        "log_probs",
        "length",
        "aborted",
        "future",
        "logprob_start",
        "input_log_probs",
    )

    def __init__(
        self,
        ids: list[int],
        params: SamplingParams,
        adapter: str | None,
        budget: int,
        stop_ids: set[int],
        seed: int,
        logprob_start: int | None = None,
    ) -> None:
        self.ids, self.params, self.adapter, self.budget = ids, params, adapter, budget
        self.stop_ids, self.seed = stop_ids, seed
        self.logprob_start = logprob_start  # None: no prompt log-probs wanted (see ``submit``)
        self.out: list[int] = []
        self.log_probs: list[float] = []
        self.input_log_probs: list[float] = []
        self.length = 0  # positions of this request in the KV cache
        self.aborted = False
        self.future: Future[Generation] = Future()


class MultiLoraModel:
    """One frozen model, any number of named adapters, every request in flight decoding in one batch.

    :meth:`submit` is thread-safe and returns at once; a worker thread (started on demand, gone when
    idle) admits queued requests with one batched prefill and then advances every running request by
    one token per forward, each on its own adapter (or none). Row ``i`` of the batch is slot ``i`` of the
    KV cache, and each adapter's rows are kept contiguous (see :meth:`_place`).
    """

    def __init__(self, model: Any, tokenizer: Any, seed: int = 0, settings: EngineSettings | None = None) -> None:
        self.base = model.eval()
        for p in self.base.parameters():
            p.requires_grad_(False)
        try:
            self.forward = BatchForward(self.base)
        except UnsupportedModel as exc:
            raise GenerationError(str(exc)) from exc
        self.tokenizer = tokenizer
        self.settings = settings or EngineSettings()
        self.adapters: dict[str, str] = {}  # served name -> the directory it was loaded from
        self._lora: dict[str, LoraWeights] = {}  # weights, kept while an unloading adapter's requests finish
        self._holds: Counter[str] = Counter()  # adapter -> requests queued or running on it
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.eos_ids = _eos_ids(model, tokenizer)
        self._generator = torch.Generator().manual_seed(seed)  # seeds of requests without sampling_seed
        self._cond = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._worker: threading.Thread | None = None
        self.closing = False

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, seed: int = 0, settings: EngineSettings | None = None
    ) -> MultiLoraModel:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        return cls(model, tokenizer, seed=seed, settings=settings)

    @property
    def vocab_size(self) -> int:
        return int(self.base.get_output_embeddings().weight.shape[0])

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def used_tokens(self) -> int:
        """KV-cache positions held by the running requests."""
        return sum(r.length for r in list(self._running))

    # --- adapters -------------------------------------------------------------------------------------

    def load_adapter(self, name: str, path: str | Path, checksum: str | None = None) -> None:
        """Load a PEFT adapter directory under ``name`` (``search`` or a version, ``search@12``); a name
        already loaded must be unloaded first. With ``checksum``, the files must match it
        (:func:`~aclarena_slime.adapter_swap.adapter_checksum`) or nothing is served. The name becomes
        servable only once the whole adapter is in memory: no request sees a half-loaded one."""
        validate_adapter_name(split_version(name)[0])
        path = Path(path)
        if not (path / "adapter_config.json").is_file():
            raise GenerationError(f"{path} is not a PEFT adapter directory (no adapter_config.json)")
        if name in self.adapters:
            raise GenerationError(f"adapter {name!r} is already loaded; unload it first (SGLang's protocol)")
        try:
            weights = LoraWeights.from_peft_dir(path, self.forward.linears)
        except UnsupportedModel as exc:
            raise GenerationError(str(exc)) from exc
        if checksum is not None:  # after reading the weights: the files read are the files checked
            try:
                verify_checksum(path, checksum)
            except AdapterSwapError as exc:
                raise GenerationError(str(exc)) from exc
        with self._cond:
            if name in self.adapters or name in self._lora:
                raise GenerationError(f"adapter {name!r} is already loaded; unload it first (SGLang's protocol)")
            self._lora[name] = weights
            self.adapters[name] = str(path)

    def unload_adapter(self, name: str) -> None:
        """Unload ``name``: new requests for it are refused at once; returns when those holding it are done."""
        with self._cond:
            if name not in self.adapters:
                raise UnknownAdapter(f"adapter {name!r} is not loaded; loaded: {sorted(self.adapters) or 'none'}")
            del self.adapters[name]
            self._cond.wait_for(lambda: self._holds[name] == 0)
            self.forward.forget(self._lora.pop(name))

    # --- requests -------------------------------------------------------------------------------------

    def submit(
        self,
        input_ids: Sequence[int],
        params: SamplingParams,
        adapter: str | None = None,
        logprob_start: int | None = None,
    ) -> Request:
        """Queue a continuation of ``input_ids``; bad input raises here, the result comes in ``.future``.

        ``logprob_start`` K asks for the log-probs of the prompt's own tokens K+1 .. end as well
        (``Generation.input_log_probs``), at the request's temperature like the output's. With
        ``max_new_tokens`` 0 that is prompt scoring: the prompt runs its prefill with the other
        requests admitted in that step, then leaves the batch without sampling.
        """
        ids = [int(t) for t in input_ids]
        if not ids:
            raise GenerationError("input_ids is empty")
        if logprob_start is not None and not 0 <= logprob_start <= len(ids):
            raise GenerationError(f"logprob_start {logprob_start} is outside the prompt of {len(ids)} tokens")
        if logprob_start is not None and logprob_start >= len(ids) - 1:
            logprob_start = None  # no prompt token after it: nothing to compute
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise GenerationError(f"input_ids must be token ids in [0, {self.vocab_size})")
        budget = params.max_new_tokens
        if self.max_positions is not None:
            if len(ids) >= self.max_positions:
                raise GenerationError(f"prompt of {len(ids)} tokens exceeds the context of {self.max_positions}")
            budget = min(budget, self.max_positions - len(ids))
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids)
        with self._cond:
            if adapter is not None and adapter not in self.adapters:
                raise UnknownAdapter(f"adapter {adapter!r} is not loaded; loaded: {sorted(self.adapters) or 'none'}")
            if params.sampling_seed is not None:
                seed = params.sampling_seed % 2**63
            else:
                seed = int(torch.randint(0, 2**63 - 1, (1,), generator=self._generator))
            request = Request(ids, params, adapter, budget, stop_ids, seed, logprob_start)
            if budget <= 0 and logprob_start is None:
                request.future.set_result(Generation([], [], {"type": LENGTH, "length": 0}))
                return request
            if adapter is not None:
                self._holds[adapter] += 1
            self._waiting.append(request)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="local-engine", daemon=True)
                self._worker.start()
            self._cond.notify_all()
        return request

    def wait_idle(self) -> None:
        """Block until no request is queued or running (the worker has stopped)."""
        with self._cond:
            self._cond.wait_for(lambda: self._worker is None)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # --- the worker ------------------------------------------------------------------------------------

    def _work(self) -> None:
        cache = self.forward.new_cache(self.settings.max_running_requests)
        while True:
            with self._cond:
                admitted = self._admit()
                if not admitted and not self._running:
                    self._worker = None
                    self._cond.notify_all()
                    return
            try:
                with torch.inference_mode():
                    self._step(admitted, cache)
            except Exception as exc:  # noqa: BLE001 - a failed forward fails its requests, not the server
                for request in [*self._running, *admitted]:
                    if not request.future.done():
                        self._release(request)
                        request.future.set_exception(exc)
                self._running = []

    def _admit(self) -> list[Request]:
        """Queued requests that join the batch now (called with the lock held); aborted ones end here."""
        admitted: list[Request] = []
        tokens = 0  # real prompt tokens, as SGLang counts them: the packed prefill runs no padding through its matmuls
        while self._waiting and len(self._running) + len(admitted) < self.settings.max_running_requests:
            request = self._waiting[0]
            if request.aborted or self.closing:
                self._waiting.popleft()
                self._finish(request, self._abort_reason())
                continue
            if admitted and tokens + len(request.ids) > self.settings.max_prefill_tokens:
                break
            tokens += len(request.ids)
            admitted.append(self._waiting.popleft())
        return admitted

    def _step(self, admitted: list[Request], cache: KVCache) -> None:
        aborted = [(i, self._abort_reason()) for i, r in enumerate(self._running) if r.aborted or self.closing]
        self._retire(aborted, cache)
        if admitted:
            admitted.sort(key=_group)  # each adapter's prompt tokens contiguous in the prefill too
            longest = max(len(r.ids) for r in admitted)
            cache.fit(max([longest, *(r.length + 1 for r in self._running)]))
            slots = self._place([*self._running, *admitted], list(range(len(self._running))), cache)
            ids = torch.zeros(len(admitted), longest, dtype=torch.long)
            for row, request in enumerate(admitted):
                ids[row, : len(request.ids)] = torch.tensor(request.ids)
                request.length = len(request.ids)
            lengths = torch.tensor([len(r.ids) for r in admitted])
            new = slots[-len(admitted) :]
            first = None
            if any(r.logprob_start is not None for r in admitted):
                first = [len(r.ids) - 1 if r.logprob_start is None else r.logprob_start for r in admitted]
            logits = self.forward.prefill(ids, lengths, cache, torch.tensor(new), self._adapters(admitted), first)
            if first is not None:
                logits = self._score_prompts(admitted, first, logits)
            going = [i for i, r in enumerate(admitted) if r.budget > 0]  # prompts only scored leave now, unsampled
            scored = [(new[i], {"type": LENGTH, "length": 0}) for i, r in enumerate(admitted) if r.budget <= 0]
            self._advance(logits[going], [new[i] for i in going], cache, scored)
        running = self._running
        if running:
            cache.fit(max(r.length for r in running) + 1)
            tokens = torch.tensor([r.out[-1] for r in running])
            lengths = torch.tensor([r.length for r in running])
            logits = self.forward.decode(tokens, lengths, cache, self.forward.lora_batch(self._adapters(running)))
            for request in running:
                request.length += 1
            self._advance(logits, list(range(len(running))), cache)

    def _score_prompts(self, admitted: list[Request], first: list[int], logits: torch.Tensor) -> torch.Tensor:
        """Keep the prompt log-probs of the requests that asked; return each prompt's last logits [n, V].

        ``logits`` holds positions ``first[i] ..`` end of each prompt, one after another (``BatchForward.prefill``).
        """
        last, start = [], 0
        for request, begin in zip(admitted, first, strict=True):
            end = start + len(request.ids) - begin
            if request.logprob_start is not None:
                targets = torch.tensor(request.ids[begin + 1 :])
                scores = token_log_probs(logits[start : end - 1], targets, request.params.temperature)
                request.input_log_probs = scores.tolist()
            last.append(end - 1)
            start = end
        return logits[last]

    def _advance(
        self, logits: torch.Tensor, slots: list[int], cache: KVCache, done: Sequence[tuple[int, dict]] = ()
    ) -> None:
        """Sample the next token of the batch's rows ``slots`` (one per row of ``logits``); retire those done
        (and the rows ``done`` already names: prompts that were only scored)."""
        done = list(done)
        if not slots:
            self._retire(done, cache)
            return
        rows = [self._running[slot] for slot in slots]
        params = [r.params for r in rows]
        tokens, log_probs = sample(
            logits,
            [p.temperature for p in params],
            [p.top_p for p in params],
            [p.top_k for p in params],
            [r.seed for r in rows],
            [len(r.out) for r in rows],
        )
        for slot, request, token, log_prob in zip(slots, rows, tokens, log_probs, strict=True):
            request.out.append(token)
            request.log_probs.append(log_prob)
            finish = self._finish_reason(request, token)
            if finish is not None:
                done.append((slot, finish))
        self._retire(done, cache)

    def _finish_reason(self, request: Request, token: int) -> dict[str, Any] | None:
        if token in request.stop_ids:
            return {"type": STOP, "matched": token}
        matched = self._stop_string(request.out, request.params.stop)
        if matched is not None:
            return {"type": STOP, "matched": matched}
        if len(request.out) >= request.budget:
            return {"type": LENGTH, "length": len(request.out)}
        return None

    def _retire(self, done: list[tuple[int, dict[str, Any]]], cache: KVCache) -> None:
        """Take rows ``done`` (slot, finish reason) out of the batch, closing the gaps they leave."""
        if not done:
            return
        gone = {slot for slot, _ in done}
        finished = [(self._running[slot], finish) for slot, finish in done]
        kept = [i for i in range(len(self._running)) if i not in gone]
        self._place([self._running[i] for i in kept], kept, cache)
        for request, finish in finished:
            self._finish(request, finish)

    def _place(self, rows: list[Request], old: list[int], cache: KVCache) -> list[int]:
        """Make ``rows`` the batch, each adapter's rows contiguous (what :class:`~.forward.LoraBatch` wants).

        ``old``: the cache slots of the first ``len(old)`` rows (the rest are new). Rows that change slot
        take their keys and values along; a row already inside its adapter's range stays, so a row
        leaving or joining moves about one row per adapter. Returns each row's slot.
        """
        slots = [-1] * len(rows)  # -1: not placed yet
        order = sorted(range(len(rows)), key=lambda j: _group(rows[j]))
        start = 0
        while start < len(order):
            end = start
            while end < len(order) and _group(rows[order[end]]) == _group(rows[order[start]]):
                end += 1
            members = order[start:end]
            for j in members:
                if j < len(old) and start <= old[j] < end:
                    slots[j] = old[j]
            taken = {slots[j] for j in members}
            free = iter(p for p in range(start, end) if p not in taken)
            for j in members:
                if slots[j] < 0:
                    slots[j] = next(free)
            start = end
        moves = [(o, n) for o, n in zip(old, slots, strict=False) if o != n]
        if moves:
            cache.move([o for o, _ in moves], [n for _, n in moves])
        running: list[Any] = [None] * len(rows)
        for request, slot in zip(rows, slots, strict=True):
            running[slot] = request
        self._running = running
        return slots

    def _finish(self, request: Request, finish: dict[str, Any]) -> None:
        self._release(request)
        request.future.set_result(Generation(request.out, request.log_probs, finish, request.input_log_probs))

    def _release(self, request: Request) -> None:
        if request.adapter is not None:
            with self._cond:
                self._holds[request.adapter] -= 1
                self._cond.notify_all()

    def _abort_reason(self) -> dict[str, Any]:
        message = "the engine is shutting down" if self.closing else "aborted by /abort_request"
        return {"type": ABORT, "message": message}

    def _adapters(self, rows: list[Request]) -> list[LoraWeights | None]:
        return [None if r.adapter is None else self._lora[r.adapter] for r in rows]

    def _stop_string(self, out: list[int], stops: tuple[str, ...]) -> str | None:
        if not stops:
            return None
        # A stop string spans a few tokens at most; decoding the tail keeps this cheap on long outputs.
        tail = self.tokenizer.decode(out[-max(len(s) for s in stops) - 4 :], skip_special_tokens=False)
        for stop in stops:
            if stop in tail:
                return stop
        return None


def _group(request: Request) -> tuple[bool, str]:
    """The batch's order of adapters: the base model's rows first, then each adapter's by name."""
    return request.adapter is not None, request.adapter or ""


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return ids
