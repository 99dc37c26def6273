"""The expert manifest (``experts.json``): which LoRA expert serves which environment tag.

Written by the curriculum, always through :meth:`ExpertTable.save` (so what is written is what a
reader accepts); read by the rollout (``lora_path`` per request), the router and the evaluation.
Paths are relative to the manifest's folder unless absolute; adapter paths must stay inside it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aclarena_slime.jsonl import write_json_atomic

MANIFEST_VERSION = 1
EXPERTS_NAME = "experts.json"  # the manifest's file name beside a run's outputs (the curriculum's, parallel MLE's)
_ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class ExpertError(ValueError):
    pass


class UnknownExpert(ExpertError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Expert:
    tag: str
    adapter: str  # the name SGLang knows the adapter by (``lora_path`` in requests)
    path: Path | None = None
    stage: str | None = None


@dataclass(frozen=True)
class ExpertTable:
    experts: Mapping[str, Expert]
    base_name: str | None = None
    base_path: Path | None = None
    default: str | None = None  # tag used for a request without one (never for an unknown tag)
    root: Path | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def lookup(self, tag: str | None) -> Expert:
        """The expert for ``tag``; for no tag (None) the default expert when configured.

        An unknown tag is an error naming the known tags even when a default exists (docs/lora.md, the
        expert manifest): a misspelt tag must not be served silently by another domain's expert.
        """
        if tag is not None and tag in self.experts:
            return self.experts[tag]
        if tag is None and self.default is not None:
            return self.experts[self.default]
        known = ", ".join(sorted(self.experts)) or "(none)"
        what = f"environment tag {tag!r}" if tag is not None else "a request without an environment tag"
        raise UnknownExpert(f"no LoRA expert for {what}; known tags: {known}")

    def adapter_for(self, tag: str | None) -> str:
        return self.lookup(tag).adapter

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], root: str | Path | None = None) -> ExpertTable:
        """Build from a manifest dict, or from the short form ``{tag: adapter_name}`` a recipe may give."""
        root_path = Path(root).resolve() if root is not None else None
        if not isinstance(data, Mapping):
            raise ExpertError(f"an expert manifest is a JSON object, got {type(data).__name__}")
        if "experts" not in data:
            data = {"version": MANIFEST_VERSION, "experts": dict(data)}
        if data.get("version", MANIFEST_VERSION) != MANIFEST_VERSION:
            raise ExpertError(f"unsupported expert manifest version {data.get('version')!r}")
        entries, base = data.get("experts") or {}, data.get("base") or {}
        if not isinstance(entries, Mapping) or not isinstance(base, Mapping):
            raise ExpertError("an expert manifest's 'experts' and 'base' are JSON objects")
        experts: dict[str, Expert] = {}
        for tag, entry in entries.items():
            if isinstance(entry, str):
                entry = {"adapter": entry}
            if not isinstance(entry, Mapping) or not all(
                isinstance(entry.get(key), str | None) for key in ("adapter", "path", "stage")
            ):
                raise ExpertError(
                    f"expert {tag!r}: expected an adapter name or an object with string 'adapter', 'path', 'stage'; "
                    f"got {json.dumps(entry, default=str)[:200]}"
                )
            adapter = tag if entry.get("adapter") is None else entry["adapter"]
            validate_adapter_name(adapter)
            path = resolve_inside(root_path, entry["path"]) if entry.get("path") and root_path else None
            experts[tag] = Expert(tag=tag, adapter=adapter, path=path, stage=entry.get("stage"))
        default = data.get("default")
        if default is not None and default not in experts:
            raise ExpertError(f"default expert {default!r} is not one of the experts: {', '.join(sorted(experts))}")
        base_path = base.get("path")
        return cls(
            experts=experts,
            base_name=base.get("name"),
            base_path=(
                root_path / base_path
                if root_path and base_path and not os.path.isabs(base_path)
                else Path(base_path)
                if base_path
                else None
            ),
            default=default,
            root=root_path,
            extra={k: v for k, v in data.items() if k not in {"version", "experts", "base", "default"}},
        )

    @classmethod
    def load(cls, manifest: str | Path) -> ExpertTable:
        manifest = Path(manifest)
        try:
            data = json.loads(manifest.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ExpertError(f"cannot read expert manifest {manifest}: {exc}") from exc
        return cls.from_mapping(data, root=manifest.parent)

    def save(self, manifest: str | Path) -> None:
        """Write the table as ``manifest`` (atomically), its paths relative to that file's folder."""
        manifest = Path(manifest)
        write_json_atomic(manifest, self.to_mapping(manifest.parent))

    def to_mapping(self, root: str | Path | None = None) -> dict[str, Any]:
        """The manifest dict; paths inside ``root`` (default: the table's own) relative to it, others absolute."""
        base_dir = Path(root).resolve() if root is not None else self.root

        def rel(p: Path | None) -> str | None:
            if p is None:
                return None
            if base_dir is not None and (p == base_dir or base_dir in p.parents):
                return os.path.relpath(p, base_dir)
            return str(p)

        experts = {}
        for tag, e in self.experts.items():
            entry: dict[str, Any] = {"adapter": e.adapter}
            if e.path is not None:
                entry["path"] = rel(e.path)
            if e.stage is not None:
                entry["stage"] = e.stage
            experts[tag] = entry
        return {
            "version": MANIFEST_VERSION,
            "base": {"name": self.base_name, "path": rel(self.base_path)},
            "experts": experts,
            "default": self.default,
            **dict(self.extra),
        }


def validate_adapter_name(name: str) -> str:
    if not _ADAPTER_NAME.match(name) or ".." in name:
        raise ExpertError(f"invalid adapter name {name!r}: letters, digits, '_', '-', '.' only")
    return name


def resolve_inside(root: Path, relative: str | os.PathLike[str]) -> Path:
    """``root / relative`` resolved, refusing anything that escapes ``root`` (``../../etc/passwd``)."""
    candidate = Path(relative)
    full = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if full != root and root not in full.parents:
        raise ExpertError(f"adapter path {str(relative)!r} is outside the experts' directory {root}")
    return full
