"""The paper's domains as one list, and the plans that make each paper curriculum's stages from it.

A domain list (``recipes/curriculum/domains/paper.yaml``) names each domain once, in the chain's order: its
env tag, its stage recipe(s) for each role (the chain's RL stage and warm start, the oracle, the MLE expert, the
oracle's rollout-only run for the SDFT data), its SDFT threshold and its datasets in the paper suite. A
curriculum file says ``stages_from: {domains: FILE, plan: DOTTED.PATH, options: {...}}`` instead of listing
stages; the plan (a function here, or one of your own, as the arena's methods) turns the list into the stage
entries. A new domain is its stage recipe plus one entry: every paper curriculum, the SDFT mixture, the paper
suite (``datasets_from``) and the parallel-MLE mix's evaluation (``held_out``, :func:`.compose.held_out`) then
have it (``docs/curricula.md``). A role without a recipe of its own runs the domain's stage recipe
with the role's overrides (from the base, LoRA on, rollout only).

Stage names: a role's own recipe names its stage (its file's stem, as the authors' run folders); otherwise
``<role>_<name>`` (``oracle_reasoning_gym``), ``name`` being the domain's short name (``if`` for IFEval).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aclarena_slime.dotted import DottedPathError, load_dotted
from aclarena_slime.recipes.compose import RecipeError

ROLE_RECIPES = ("stage", "warm_start", "oracle", "oracle_warm_start", "mle", "rollouts")
FROM_BASE = "checkpoint.load=${model.torch_dist}"  # an oracle on the stage recipe: from the base model
ORACLE_EXPORT = "++checkpoint.save_hf=${paths.runs}/${name}/hf"  # what its rollout-only run serves
LORA = "lora.enabled=true"  # an expert on the stage recipe
ROLLOUT_ONLY = (  # the oracle's rollout-only run on its recipe: every sample dumped, the SDFT filter chooses later
    "++extra.debug_rollout_only=true",
    '++extra.save_debug_rollout_data="${paths.runs}/${name}/dump/rollout_data/{rollout_id}.pt"',
    "rollout.dynamic_sampling_filter_path=null",
    "rollout.over_sampling_batch_size=null",
)


@dataclass
class Domain:
    """One domain of the study: what each curriculum trains of it, and how the suite evaluates it."""

    tag: str = MISSING  # its env tag: the expert's route, the SDFT mixture's key, the suite's env
    name: str | None = None  # the stage names' suffix (replay_if); None: the tag
    stage: str = MISSING  # its RL stage in the sequential chain (relative to the list's folder, or absolute)
    warm_start: str | None = None  # the chain's SFT warm start before the RL stage
    oracle: str | None = None  # trained alone from the base (None: the stage recipe from the base)
    oracle_warm_start: str | None = None  # the oracle's warm start, from the base
    mle: str | None = None  # its LoRA expert on the SDFT backbone (None: the stage recipe, LoRA on)
    rollouts: str | None = None  # the oracle's rollout-only run (None: the oracle's recipe, rollout only)
    sdft_threshold: float = 1.0  # the reward a rollout needs to join the SDFT mixture
    smoke_warm_start: list[str] = field(default_factory=list)  # its warm start's overrides in the local smoke
    eval: dict[str, Any] = field(default_factory=dict)  # its datasets in the paper suite (name -> entry)
    held_out: dict[str, str] = field(default_factory=dict)  # its sets in a mixed stage's evaluation, under paths.data

    def __post_init__(self) -> None:
        self.name = self.name or self.tag


@dataclass
class DomainList:
    domains: list[Domain] = field(default_factory=list)


@dataclass
class StagesFrom:
    """A curriculum's stages made from a domain list by a plan."""

    domains: str = MISSING  # the list, relative to the curriculum file's folder (or absolute)
    plan: str = MISSING  # dotted path of the plan function (aclarena_slime.recipes.domains.sequential)
    options: dict[str, Any] = field(default_factory=dict)


Plan = Callable[[Sequence[Domain], Mapping[str, Any]], list[dict[str, Any]]]


def load_domains(path: str | Path) -> list[Domain]:
    """Read a domain list; each role's recipe resolved against the list's folder."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
        entries = data.get("domains") if isinstance(data, dict) else None
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise RecipeError(f"{path}: a domain list is a mapping with 'domains', a list of entries")
        # the suite's entries name its services (${services.retriever_url}): the suite resolves them, not this
        evals = [e.pop("eval", None) or {} for e in entries]
        merged = OmegaConf.merge(OmegaConf.structured(DomainList), {"domains": entries})
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise RecipeError(f"{path}: required settings have no value: {', '.join(missing)}")
        domains: list[Domain] = OmegaConf.to_object(merged).domains
    except (OSError, yaml.YAMLError, OmegaConfBaseException) as exc:
        raise RecipeError(f"{path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
    for domain, own in zip(domains, evals, strict=True):
        domain.eval = own
    if not domains:
        raise RecipeError(f"{path}: a domain list needs at least one domain")
    for key in ("tag", "name"):
        seen = [getattr(d, key) for d in domains]
        if len(seen) != len(set(seen)):
            raise RecipeError(f"{path}: every domain needs its own {key}; got {seen}")
    folder = path.resolve().parent
    for domain in domains:
        for role in ROLE_RECIPES:
            recipe = getattr(domain, role)
            if recipe is not None:
                setattr(domain, role, str((folder / recipe).resolve()))
    return domains


def plan_stages(spec: StagesFrom, curriculum_folder: Path) -> list[dict[str, Any]]:
    """The stage entries ``spec``'s plan makes of its domain list."""
    domains = load_domains(curriculum_folder / spec.domains)
    try:
        plan = load_dotted(spec.plan)
    except (DottedPathError, ImportError, AttributeError) as exc:
        raise RecipeError(f"cannot load the plan {spec.plan!r}: {exc}") from exc
    try:
        return plan(domains, dict(spec.options))
    except (TypeError, ValueError) as exc:
        raise RecipeError(f"plan {spec.plan}: {exc}") from exc


def _named(recipe: str | None, fallback: str) -> str:
    return Path(recipe).stem if recipe else fallback


def _stage(name: str, recipe: str, *overrides: str, start: str | None = None, expert: str | None = None) -> dict:
    out: dict[str, Any] = {"name": name, "recipe": recipe}
    if start:
        out["start"] = start
    if expert:
        out["expert"] = expert
    if overrides:
        out["overrides"] = list(overrides)
    return out


def sequential(domains: Sequence[Domain], options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The paper's chain as the authors ran it: each domain's warm start (if any), then its RL stage, each from
    the stage before; stages named by their recipes."""
    _no_options("sequential", options, set())
    out = []
    for d in domains:
        if d.warm_start:
            out.append(_stage(_named(d.warm_start, ""), d.warm_start))
        out.append(_stage(_named(d.stage, ""), d.stage))
    return out


def chain(domains: Sequence[Domain], options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A chain of ``<prefix>_<name>`` stages (the replay and KL-anchor baselines, the local smoke).

    ``options``: ``prefix`` (required); ``warm_starts`` (default false: the RL stages only; true: each warm start
    before its stage, as ``<prefix>_<name>_sft`` with the domain's ``smoke_warm_start`` overrides); ``experts``
    (the tags whose stage serves as an expert)."""
    _no_options("chain", options, {"prefix", "warm_starts", "experts"}, ("prefix",))
    prefix, experts = str(options["prefix"]), set(options.get("experts") or ())
    out = []
    for d in domains:
        if d.warm_start and options.get("warm_starts", False):
            out.append(_stage(f"{prefix}_{d.name}_sft", d.warm_start, *d.smoke_warm_start))
        out.append(_stage(f"{prefix}_{d.name}", d.stage, expert=d.tag if d.tag in experts else None))
    return out


def oracles(domains: Sequence[Domain], options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each domain alone from the base model, after its own warm start where it has one."""
    _no_options("oracles", options, set())
    out = []
    for d in domains:
        start = "recipe"
        if d.oracle_warm_start:
            out.append(_stage(_named(d.oracle_warm_start, ""), d.oracle_warm_start, start="recipe"))
            start = out[-1]["name"]
        own = () if d.oracle else (FROM_BASE, ORACLE_EXPORT)
        out.append(_stage(oracle_name(d), d.oracle or d.stage, *own, start=start))
    return out


def oracle_name(domain: Domain) -> str:
    return _named(domain.oracle, f"oracle_{domain.name}")


def mle(domains: Sequence[Domain], options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Mixture of LoRA experts: ``options.backbone`` (a recipe, relative to the curriculum file) first, then one
    expert per domain on it, routed by the domain's tag."""
    _no_options("mle", options, {"backbone"}, ("backbone",))
    out = [_stage("sdft_backbone", str(options["backbone"]))]
    for d in domains:
        own = () if d.mle else (LORA,)
        out.append(_stage(_named(d.mle, f"mle_{d.name}"), d.mle or d.stage, *own, start="sdft_backbone", expert=d.tag))
    return out


def sdft_data(domains: Sequence[Domain], options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """SDFT steps 2 and 3: each oracle (the oracles curriculum's outputs under ``options.oracles``) rolls out
    with nothing trained, then ``options.backbone`` trains on every domain's good episodes, domain-tagged."""
    _no_options("sdft_data", options, {"oracles", "backbone"}, ("oracles", "backbone"))
    runs = f"{str(options['oracles']).rstrip('/')}/runs"
    out, dumps, thresholds = [], {}, {}
    for d in domains:
        oracle = oracle_name(d)
        own = () if d.rollouts else ROLLOUT_ONLY
        name = _named(d.rollouts, f"oracle_rollouts_{d.name}")
        load = (f"model.hf_checkpoint={runs}/{oracle}/hf", f"checkpoint.load={runs}/{oracle}/checkpoint")
        out.append(_stage(name, d.rollouts or d.oracle or d.stage, *own, *load, start="recipe"))
        dumps[d.tag], thresholds[d.tag] = name, d.sdft_threshold
    backbone = _stage("sdft_backbone", str(options["backbone"]), start="recipe")
    return [*out, {**backbone, "distill": {"dumps": dumps, "thresholds": thresholds}}]


def _no_options(plan: str, options: Mapping[str, Any], known: set[str], required: tuple[str, ...] = ()) -> None:
    absent = [key for key in required if options.get(key) is None]
    if absent:
        raise ValueError(f"{plan}: options.{absent[0]} is required")
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"{plan}: unknown option(s) {unknown}; known: {sorted(known) or 'none'}")
