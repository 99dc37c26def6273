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

``stage`` (a stage recipe under ``recipes/``, e.g. ``stage3_retail``) makes the dataset reproduce that stage's
rollout by construction: its response budget and budget mode, context cap, stop strings and ids, top-k, chat
template arguments and env settings come from the stage's compiled command (a reader from the recipes layer,
:func:`aclarena_slime.recipes.compiler.load_stage_suite`, supplies them); the suite sets only ``n_samples``,
``temperature``, ``top_p`` and ``limit``, and ``env_config`` entries merged over the stage's (machine services, and
the accuracy scoring recipes/FIDELITY.md lists). Setting a stage's own key in the suite is an error.
Machine-specific values (a retriever URL, a data folder, the user simulator) are declared once under
``services:`` and referenced as ``${services.NAME}`` (OmegaConf interpolation, as in the recipes) in
``path`` and ``env_config``; the command line fills them (``aclarena eval run SUITE --service
retriever_url=http://...``), so one suite serves every machine. A dataset whose services are still
unset refuses to run and names the flag.

``datasets_from: FILE`` (instead of ``datasets``) takes the datasets from a domain list, each domain's ``eval``
entries (``recipes/eval/paper.yaml`` from ``recipes/curriculum/domains/paper.yaml``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
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
class StageRollout:
    """What one stage's training rollout sends for one env, read from its compiled command."""

    stage: str
    max_response_len: int
    budget_mode: str = "total"
    max_context_len: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    top_k: int = -1
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    env_config: dict[str, Any] = field(default_factory=dict)


#: ``(stage, env tag) -> StageRollout``; the recipes layer provides one (evaluation sits below recipes).
StageReader = Callable[[str, str], StageRollout]
# What a stage-bound dataset takes from its stage and so may not set itself.
STAGE_KEYS = frozenset({"max_response_len", "max_turns", "top_k", "chat_template_kwargs"})


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
    stage: str = ""  # the stage whose rollout this dataset reproduces (the fields below come from it)
    budget_mode: str = "total"  # what max_response_len bounds (rollout.Budgets): all turns, or each turn
    max_context_len: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.domain:
            object.__setattr__(self, "domain", self.env)

    @property
    def unset_services(self) -> list[str]:
        """The services this dataset uses that have no value yet (their markers are still in it)."""
        return sorted(set(_UNSET.findall(repr((self.path, self.env_config)))))

    def sampling_params(self) -> dict[str, Any]:
        """SGLang sampling params, the keys slime's rollout sends (slime/rollout/sglang_rollout.py, GenerateState:
        temperature, top-p, top-k, stop strings and ids, ``skip_special_tokens`` off, ``no_stop_trim``, no spaces
        between special tokens), so an eval request differs from a training one only in the sampled settings; the
        agent loop sets ``max_new_tokens`` from the remaining budget."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": -1 if self.top_k is None else self.top_k,
            "stop": list(self.stop) or None,
            "stop_token_ids": list(self.stop_token_ids) or None,
            "skip_special_tokens": False,
            "no_stop_trim": True,
            "spaces_between_special_tokens": False,
        }

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
_SETTABLE = set(_FIELDS) - {"name", "budget_mode", "max_context_len", "stop", "stop_token_ids"}
_INTS = {"n_samples", "top_k", "max_response_len", "max_turns", "limit", "demo"}
_FLOATS = {"temperature", "top_p"}
_DICTS = {"env_config", "chat_template_kwargs"}


def parse_suite(
    data: Any,
    source: str = "<suite>",
    services: Mapping[str, str] | None = None,
    stages: StageReader | None = None,
) -> EvalSuite:
    """Build a suite from its YAML mapping, with errors that name ``source`` and the key; ``stages`` reads the
    rollout of a dataset's ``stage`` (required when a dataset names one)."""
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
        own = sorted(STAGE_KEYS & set(merged)) if merged.get("stage") else []
        if own:
            raise SuiteError(f"{where}: {', '.join(own)}: set by stage {merged['stage']!r}, not here")
        merged = _with_services(merged, values, where)
        dataset = EvalDataset(name=str(name), **{k: _coerce(k, v, where) for k, v in merged.items()})
        datasets.append(_bind_stage(dataset, stages, where) if dataset.stage else dataset)
    return EvalSuite(name=str(data.get("name") or Path(source).stem), datasets=tuple(datasets))


def load_suite(
    path: str | Path, services: Mapping[str, str] | None = None, stages: StageReader | None = None
) -> EvalSuite:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SuiteError(f"cannot read eval suite {path}: {exc}") from exc
    if isinstance(data, dict) and "datasets_from" in data:
        data = {**data, "datasets": domain_datasets(path, data)}
        del data["datasets_from"]
    return parse_suite(data, str(path), services, stages)


def domain_datasets(path: Path, data: Mapping[str, Any]) -> dict[str, Any]:
    """The datasets of a suite's ``datasets_from``: a domain list (recipes/curriculum/domains/paper.yaml, relative
    to the suite's folder), each domain's ``eval`` entries in the list's order, so a domain joins the suite with
    its entry in the list."""
    if data.get("datasets"):
        raise SuiteError(f"{path}: give datasets or datasets_from, not both")
    source = path.resolve().parent / str(data["datasets_from"])
    try:
        domains = yaml.safe_load(source.read_text())["domains"]
        entries = [(d["tag"], d.get("eval") or {}) for d in domains]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise SuiteError(f"{path}: datasets_from {source}: not a domain list with tagged domains ({exc})") from exc
    out: dict[str, Any] = {}
    for tag, own in entries:
        repeated = sorted(set(own) & set(out))
        if repeated:
            raise SuiteError(f"{path}: domain {tag!r} repeats the dataset(s) {repeated} of an earlier domain")
        out.update(own)
    return out


def _bind_stage(dataset: EvalDataset, stages: StageReader | None, where: str) -> EvalDataset:
    """``dataset`` with its stage's rollout settings; its own ``env_config`` merged over the stage's."""
    if stages is None:
        raise SuiteError(
            f"{where}: reproduces stage {dataset.stage!r}; load the suite with a stage reader "
            "(aclarena_slime.recipes.compiler.load_stage_suite)"
        )
    try:
        rollout = stages(dataset.stage, dataset.env)
    except (OSError, ValueError) as exc:
        raise SuiteError(f"{where}: stage {dataset.stage!r}: {exc}") from exc
    return replace(
        dataset,
        max_response_len=rollout.max_response_len,
        budget_mode=rollout.budget_mode,
        max_context_len=rollout.max_context_len,
        stop=tuple(rollout.stop),
        stop_token_ids=tuple(rollout.stop_token_ids),
        top_k=rollout.top_k,
        chat_template_kwargs=dict(rollout.chat_template_kwargs),
        env_config=deep_merge(rollout.env_config, dataset.env_config),
    )


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s entries, mappings merged key by key (``over``'s None replaces a mapping)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


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
