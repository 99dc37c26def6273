"""Evaluation suites: which datasets, through which environment, with which sampling settings.

A suite is a YAML file (``recipes/eval/*.yaml``)::

    name: paper
    defaults:              # apply to every dataset unless it sets its own
      temperature: 1.0
      max_response_len: 16384
    datasets:
      aime24:
        env: math          # env tag: picks the plugin and, with experts, the LoRA expert
        path: aime-2024.jsonl   # slime JSONL (prompt, label, metadata); relative to the data root
        n_samples: 16      # samples per prompt; accuracy is the mean over all of them (avg@n)

Dataset keys: ``env`` and ``path`` (required; or ``demo: N``, the env's first N generated demo records,
for smoke runs that need no data files), ``domain (the column of the forgetting matrix; the
env tag by default), ``n_samples``, ``temperature``, ``top_p``, ``top_k``, ``max_response_len``
(token budget of the whole response, observations included), ``max_turns``, ``limit`` (first N
records), ``env_config`` (the env's settings), ``chat_template_kwargs``. Unknown keys are errors.
Machine-specific values (a retriever URL, a data folder, the user simulator) are declared once under
``services:`` and referenced as ``${services.NAME}`` (OmegaConf interpolation, as in the recipes) in
``path`` and ``env_config``; the command line fills them (``aclarena eval run SUITE --service
retriever_url=http://...``), so one suite serves every machine. A dataset whose services are still
unset refuses to run and names the flag.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationKeyError, OmegaConfBaseException

# The seed of held-out demo records: a ``demo`` dataset draws the env's demo records at this seed, and a local
# stage of seed s holds out those of seed s + HELD_OUT_SEED (its training records are drawn at seed s). At the
# default seed 0 the evaluation, the forgetting monitor and the local stage hold out the same prompts.
HELD_OUT_SEED = 10_007
# How many of the held-out seed's demo records every local stage leaves out of training, whatever its own
# ``eval_size``: a forgetting monitor checks up to this many of them (``monitor.demo_size``).
HELD_OUT_DEMOS = 32


class SuiteError(ValueError):
    """A suite file is malformed; the message names the file and the offending key."""


@dataclass(frozen=True)
class EvalDataset:
    name: str
    env: str
    path: str = ""
    demo: int | None = None  # instead of a path: the env's demo records (smoke runs)
    domain: str = ""
    n_samples: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_response_len: int = 4096
    max_turns: int | None = None
    limit: int | None = None
    env_config: dict[str, Any] = field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.domain:
            object.__setattr__(self, "domain", self.env)

    @property
    def unset_services(self) -> list[str]:
        """The services this dataset uses that have no value yet (their markers are still in it)."""
        return sorted(set(_UNSET.findall(repr((self.path, self.env_config)))))

    def sampling_params(self) -> dict[str, Any]:
        """SGLang sampling params; the agent loop sets ``max_new_tokens`` from the remaining budget."""
        params: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p}
        if self.top_k is not None:
            params["top_k"] = self.top_k
        return params

    def resolved_path(self, data_root: str | Path | None) -> Path:
        path = Path(os.path.expanduser(self.path))
        return path if path.is_absolute() or data_root is None else Path(data_root) / path


@dataclass(frozen=True)
class EvalSuite:
    name: str
    datasets: tuple[EvalDataset, ...]

    def require_services(self) -> EvalSuite:
        """The suite itself, once every ``${services.NAME}`` its datasets use has a value."""
        missing = {f"{d.name}: {name}" for d in self.datasets for name in d.unset_services}
        if missing:
            names = sorted({m.split(": ")[1] for m in missing})
            raise SuiteError(
                f"suite {self.name!r} needs values for {', '.join(sorted(missing))}; "
                + " ".join(f"pass --service {n}=VALUE" for n in names)
                + " (or --only the datasets that need none)"
            )
        return self

    def select(self, names: list[str] | None) -> EvalSuite:
        """The suite restricted to ``names`` (all when empty); unknown names are an error."""
        if not names:
            return self
        known = {d.name for d in self.datasets}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SuiteError(
                f"suite {self.name!r} has no dataset {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return replace(self, datasets=tuple(d for d in self.datasets if d.name in names))

    def with_limit(self, limit: int | None) -> EvalSuite:
        """Cap every dataset at ``limit`` records (smoke runs)."""
        if limit is None:
            return self
        return replace(
            self, datasets=tuple(replace(d, limit=min(limit, d.limit) if d.limit else limit) for d in self.datasets)
        )


_FIELDS = {f.name: f for f in fields(EvalDataset)}
_SETTABLE = set(_FIELDS) - {"name"}
_INTS = {"n_samples", "top_k", "max_response_len", "max_turns", "limit", "demo"}
_FLOATS = {"temperature", "top_p"}
_DICTS = {"env_config", "chat_template_kwargs"}


def parse_suite(data: Any, source: str = "<suite>", services: Mapping[str, str] | None = None) -> EvalSuite:
    """Build a suite from its YAML mapping, with errors that name ``source`` and the key."""
    if not isinstance(data, Mapping):
        raise SuiteError(f"{source}: a suite is a mapping with 'datasets'")
    unknown = set(data) - {"name", "defaults", "datasets", "services"}
    if unknown:
        raise SuiteError(
            f"{source}: unknown top-level key(s) {sorted(unknown)}; expected name, services, defaults, datasets"
        )
    declared = dict(data.get("services") or {})
    undeclared = set(services or {}) - set(declared)
    if undeclared:
        raise SuiteError(f"{source}: no service {sorted(undeclared)} declared; declared: {', '.join(sorted(declared))}")
    values = {**declared, **{k: v for k, v in dict(services or {}).items() if v is not None}}
    defaults = _check_keys(data.get("defaults") or {}, f"{source}: defaults")
    entries = data.get("datasets")
    if isinstance(entries, list):
        entries = {str((e or {}).get("name", "")): {k: v for k, v in (e or {}).items() if k != "name"} for e in entries}
    if not isinstance(entries, Mapping) or not entries:
        raise SuiteError(f"{source}: 'datasets' must name at least one dataset")
    datasets = []
    for name, entry in entries.items():
        if not name:
            raise SuiteError(f"{source}: every dataset needs a name")
        where = f"{source}: dataset {name!r}"
        merged = {**defaults, **_check_keys(entry or {}, where)}
        if not merged.get("env"):
            raise SuiteError(f"{where}: 'env' is required")
        if bool(merged.get("path")) == bool(merged.get("demo")):
            raise SuiteError(f"{where}: give either 'path' (a slime JSONL file) or 'demo' (a record count)")
        merged = _with_services(merged, values, where)
        datasets.append(EvalDataset(name=str(name), **{k: _coerce(k, v, where) for k, v in merged.items()}))
    return EvalSuite(name=str(data.get("name") or Path(source).stem), datasets=tuple(datasets))


def load_suite(path: str | Path, services: Mapping[str, str] | None = None) -> EvalSuite:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SuiteError(f"cannot read eval suite {path}: {exc}") from exc
    return parse_suite(data, str(path), services)


_UNSET = re.compile(r"<unset service (\w+): pass --service")


def _with_services(entry: dict[str, Any], services: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``entry`` with its ``${services.NAME}`` interpolations resolved.

    A service without a value resolves to a marker naming the flag to pass (``EvalDataset.unset_services``
    finds it); :meth:`EvalSuite.require_services` refuses a dataset that holds one."""
    values = {k: f"<unset service {k}: pass --service {k}=VALUE>" if v is None else v for k, v in services.items()}
    node = OmegaConf.create({"services": values, "entry": entry})
    try:
        resolved = OmegaConf.to_container(node.entry, resolve=True)
    except InterpolationKeyError as exc:
        declared = ", ".join(sorted(services)) or "none"
        raise SuiteError(f"{where}: {str(exc).splitlines()[0]}: not declared under services ({declared})") from exc
    except OmegaConfBaseException as exc:
        raise SuiteError(f"{where}: {str(exc).splitlines()[0]}") from exc
    return resolved


def _check_keys(entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        raise SuiteError(f"{where}: expected a mapping, got {type(entry).__name__}")
    unknown = set(entry) - _SETTABLE
    if unknown:
        raise SuiteError(f"{where}: unknown key(s) {sorted(unknown)}; known: {', '.join(sorted(_SETTABLE))}")
    return dict(entry)


def _coerce(key: str, value: Any, where: str) -> Any:
    if value is None:
        return None
    try:
        if key in _INTS:
            if (
                isinstance(value, bool)
                or int(value) != value
                or (int(value) < 1 and not (key == "top_k" and value == -1))
            ):
                raise ValueError
            return int(value)
        if key in _FLOATS:
            if isinstance(value, bool) or float(value) < 0:
                raise ValueError
            return float(value)
    except (TypeError, ValueError):
        raise SuiteError(f"{where}: {key} must be a positive number, got {value!r}") from None
    if key in _DICTS and not isinstance(value, Mapping):
        raise SuiteError(f"{where}: {key} must be a mapping, got {value!r}")
    if key in _DICTS:
        return dict(value)
    return str(value)
