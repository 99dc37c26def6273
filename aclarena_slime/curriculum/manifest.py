"""The curriculum manifest: stage -> status, checkpoint / adapter, eval summary; env tag -> expert.

Written atomically (temp file + rename) after every change, so a crash leaves the last good state.
``stages`` is a list in training order with ``name``, ``env`` and ``eval`` per stage: the shape
``aclarena eval matrix --manifest`` reads. When stages produced experts, ``experts.json`` (the
expert manifest, :mod:`aclarena_slime.experts`) is written beside it through ``ExpertTable``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aclarena_slime.experts import EXPERTS_NAME, MANIFEST_VERSION, ExpertError, ExpertTable, resolve_inside
from aclarena_slime.jsonl import write_json_atomic

MANIFEST_NAME = "manifest.json"
DONE, RUNNING, FAILED = "done", "running", "failed"


@dataclass
class Manifest:
    path: Path
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, output_dir: Path, name: str) -> Manifest:
        path = Path(output_dir) / MANIFEST_NAME
        if path.exists():
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("name") != name:
                raise ValueError(
                    f"{path} belongs to curriculum {data.get('name')!r}, not {name!r}; use another output_dir"
                )
            return cls(path, data)
        return cls(path, {"version": 1, "name": name, "stages": [], "experts": {}})

    def stage(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.data["stages"] if s["name"] == name), None)

    def is_done(self, name: str) -> bool:
        entry = self.stage(name)
        return entry is not None and entry.get("status") == DONE

    def update_stage(self, name: str, **values: Any) -> dict[str, Any]:
        entry = self.stage(name)
        if entry is None:
            entry = {"name": name}
            self.data["stages"].append(entry)
        entry.update(values)
        self.save()
        return entry

    def set_expert(self, tag: str, adapter: str, stage: str, base: dict[str, Any] | None) -> None:
        self._register(tag, adapter, stage, base)
        self.save()
        self.write_experts()

    def _register(self, tag: str, adapter: str, stage: str, base: dict[str, Any] | None) -> None:
        self.data["experts"][tag] = {"adapter": tag, "path": adapter, "stage": stage}
        if base is not None:
            self.data["base"] = base

    def finish_stage(self, name: str, expert: tuple[str, str, dict[str, Any] | None] | None = None, **values: Any) -> None:
        """Record a stage's result and, when it is an expert (``(tag, adapter, base)``), register the expert in
        the same write: a stage is never done without its expert. ``experts.json`` follows; a crash between the
        two writes is repaired by :meth:`write_experts` on the next run."""
        entry = self.stage(name)
        if entry is None:
            entry = {"name": name}
            self.data["stages"].append(entry)
        entry.update(values)
        if expert is not None:
            self._register(expert[0], expert[1], name, expert[2])
        self.save()
        if expert is not None:
            self.write_experts()

    def has_expert(self, tag: str, stage: str) -> bool:
        """Whether ``tag``'s expert is the one ``stage`` trained, in the manifest and in ``experts.json``."""
        if (self.data["experts"].get(tag) or {}).get("stage") != stage:
            return False
        try:
            table = ExpertTable.load(self.path.with_name(EXPERTS_NAME))
        except ExpertError:
            return False
        return tag in table.experts and table.experts[tag].stage == stage

    def write_experts(self) -> None:
        """``experts.json`` beside the manifest; an adapter path outside its folder is an ExpertError here."""
        experts = {
            "version": MANIFEST_VERSION,
            "base": self.data.get("base") or {"name": self.data["name"]},
            "experts": self.data["experts"],
            "default": None,
        }
        ExpertTable.from_mapping(experts, root=self.path.parent).save(self.path.with_name(EXPERTS_NAME))

    def check_expert_path(self, adapter: str | Path, stage: str) -> None:
        """Refuse an adapter that ``experts.json`` could not name (outside the curriculum's folder) before its
        stage trains: found after training, the stage's days are lost and every rerun stops at it."""
        try:
            resolve_inside(self.path.parent.resolve(), adapter)
        except ExpertError as exc:
            raise ExpertError(
                f"stage {stage} would write its expert's adapter to {adapter}, outside the curriculum's output_dir "
                f"{self.path.parent} that experts.json names adapters in ({exc}); keep lora.sync_dir and paths.runs "
                "inside output_dir"
            ) from exc

    def save(self) -> None:
        write_json_atomic(self.path, self.data)
