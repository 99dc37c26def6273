"""Which expert serves a request: environment tag → LoRA adapter name, per endpoint.

A request names its expert in one of these ways, first match wins:

- OpenAI endpoints: ``model="<base>:<tag>"``; then the ``X-Aclarena-Env`` header; ``model="<base>"``
  alone means the base model; ``model="<tag>"`` is accepted as a shorthand.
- Native ``/generate``: the ``X-Aclarena-Env`` header; else a ``lora_path`` already in the body, which
  must be one of the experts' adapter names (``null`` means the base model).
- Neither: the tag classifier (when configured and confident), then the manifest's default expert,
  else a 400 that lists the known tags.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aclarena_slime.experts import ExpertTable, UnknownExpert
from aclarena_slime.router.classifier import TagClassifier

TAG_HEADER = "X-Aclarena-Env"


class RouteError(Exception):
    """A request the gateway cannot route; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Route:
    adapter: str | None  # the ``lora_path`` sent to the engine; None: the base model
    tag: str | None
    source: str  # how it was chosen: model, header, lora_path, classifier, default, base
    batch: tuple[str, ...] = ()  # a native batch request's per-prompt adapters

    @property
    def needs(self) -> set[str]:
        """The adapters an engine must hold to serve this request."""
        return {self.adapter} if self.adapter else set(self.batch)


class ExpertResolver:
    """Resolves requests against an :class:`ExpertTable` and, optionally, a :class:`TagClassifier`."""

    def __init__(self, table: ExpertTable, classifier: TagClassifier | None = None, min_confidence: float = 0.5):
        self.table = table
        self.classifier = classifier
        self.min_confidence = min_confidence
        self.adapters = {e.adapter for e in table.experts.values()}
        self.base_name = table.base_name or "base"

    def _expert(self, tag: str, source: str) -> Route:
        try:
            expert = self.table.lookup(tag)
        except UnknownExpert as exc:
            raise RouteError(str(exc)) from exc
        return Route(adapter=expert.adapter, tag=expert.tag, source=source)

    def _untagged(self, text: Callable[[], str]) -> Route:
        if self.classifier is not None:
            prompt = text()
            if prompt:
                tag, confidence = self.classifier.predict(prompt)
                if confidence >= self.min_confidence and tag in self.table.experts:
                    return self._expert(tag, "classifier")
        if self.table.default is not None:
            return self._expert(self.table.default, "default")
        known = ", ".join(sorted(self.table.experts)) or "(none)"
        raise RouteError(
            f"no environment tag: use model='{self.base_name}:<tag>' or the {TAG_HEADER} header "
            f"(model='{self.base_name}' for the base model); known tags: {known}"
        )

    def for_openai(self, payload: Mapping[str, Any], header_tag: str | None) -> tuple[Route, str]:
        """The route and the ``model`` string to send upstream (``<served>:<adapter>`` or ``<served>``)."""
        model = payload.get("model")
        if model is not None and not isinstance(model, str):
            raise RouteError("'model' must be a string")
        model = model or ""
        served, _, model_tag = model.rpartition(":") if ":" in model else (model, "", "")
        if model_tag:
            route = self._expert(model_tag, "model")
        elif header_tag:
            route = self._expert(header_tag, "header")
        elif model == self.base_name:
            route = Route(adapter=None, tag=None, source="base")
        elif model in self.table.experts:
            route, served = self._expert(model, "model"), ""
        else:
            route = self._untagged(lambda: prompt_text(payload))
        served = served or self.base_name
        return route, served if route.adapter is None else f"{served}:{route.adapter}"

    def for_generate(self, payload: Mapping[str, Any], header_tag: str | None) -> Route:
        """The route of a native ``/generate`` request (the caller writes ``lora_path`` from it)."""
        if header_tag:
            return self._expert(header_tag, "header")
        if "lora_path" in payload:
            given = payload["lora_path"]
            names = given if isinstance(given, list) else [given]
            for name in names:
                if name is not None and name not in self.adapters:
                    known = ", ".join(sorted(self.adapters)) or "(none)"
                    raise RouteError(f"unknown adapter {name!r} in lora_path; known adapters: {known}")
            if isinstance(given, list):
                batch = tuple(name for name in names if name is not None)
                return Route(adapter=None, tag=None, source="lora_path", batch=batch)
            return Route(adapter=given, tag=None, source="lora_path" if given else "base")
        return self._untagged(lambda: payload["text"] if isinstance(payload.get("text"), str) else "")


def prompt_text(payload: Mapping[str, Any]) -> str:
    """The words of an OpenAI request the classifier reads: message contents, or the completion prompt."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        tools = payload.get("tools")
        if isinstance(tools, list):
            parts.extend(str((t.get("function") or {}).get("name", "")) for t in tools if isinstance(t, Mapping))
        return "\n".join(parts)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]
    return prompt if isinstance(prompt, str) else ""
