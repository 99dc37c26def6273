"""The arena: several methods run over the same stages from the same base model, every domain evaluated after
every stage, so their forgetting matrices compare.

An arena file (``recipes/curriculum/arena_local.yaml``) names the stages (a recipe per domain, with its
sizing and held-out size), the shared base (:mod:`.base`), the held-out evaluation and the methods
(:mod:`aclarena_slime.curriculum.methods`, each a dotted path). For one seed, :func:`run_arena` builds the base (or
reuses it), evaluates it (the base row, for FWT), then writes each method's curriculum file under
``<output_dir>/seed_<seed>/<method>/`` and runs it with the ordinary curriculum runner (resume included): the
files say exactly what each method ran. The methods of a seed share one reuse folder (``stages/``,
:mod:`aclarena_slime.curriculum.reuse`): a stage two methods have in common (the math oracle and the chains' first
stage) runs once. After each stage the policy (its model folder, with the MLE experts so far) is served on the
local engine and every domain's held-out demo prompts are rolled out greedily (:func:`policy_evaluator`; a domain
asked of weights already evaluated, MLE's frozen backbone or an unchanged expert, is taken from ``eval_memo/``).
``arena.json`` lists the manifests; ``aclarena eval matrix --run METHOD=MANIFEST ... --base BASE_SUMMARY`` compares them.
"""

from __future__ import annotations

import asyncio
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aclarena_slime.arena.base import BaseSettings, build_base, evaluate_policy
from aclarena_slime.curriculum.methods import ArenaStage, MethodError, load_method
from aclarena_slime.curriculum.runner import Evaluator, run_curriculum
from aclarena_slime.evaluation.suite import EvalDataset, EvalSuite
from aclarena_slime.jsonl import write_json_atomic
from aclarena_slime.launcher.stage import local_profile
from aclarena_slime.local.session import LocalSession, open_session
from aclarena_slime.recipes.compose import RecipeError, load_recipe

ARENA_FILE = "arena.json"
REUSE = "stages"  # in the seed's folder: the finished stages every method of the seed may reuse
EVAL_MEMO = "eval_memo"  # in the seed's folder: evaluated datasets by the weights that answered them


@dataclass
class MethodEntry:
    method: str = MISSING  # dotted path of the method function (aclarena_slime.curriculum.methods.sequential)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ArenaConfig:
    name: str = MISSING
    output_dir: str = MISSING
    seed: int = 0
    overrides: list[str] = field(default_factory=list)  # every stage of every method
    data: dict[str, str] = field(default_factory=dict)  # env tag -> its data folder (env_config.<tag>.data_dir)
    stages: list[ArenaStage] = field(default_factory=list)
    base: BaseSettings = field(default_factory=BaseSettings)
    eval_size: int = 32  # held-out demo prompts per domain (a stage's own eval_size wins), after every stage
    methods: dict[str, MethodEntry] = field(default_factory=dict)


def is_arena(path: str | Path) -> bool:
    """Whether the YAML at ``path`` is an arena file (it has ``methods``) rather than one curriculum."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and "methods" in data


def load_arena(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> ArenaConfig:
    """Read and check an arena file; ``overrides`` are dotted ``key=value`` pairs on it (``seed=1``)."""
    path = Path(path)
    try:
        merged = OmegaConf.merge(
            OmegaConf.structured(ArenaConfig), OmegaConf.load(path), OmegaConf.from_dotlist(list(overrides))
        )
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise RecipeError(f"{path}: required settings have no value: {', '.join(missing)}")
        config: ArenaConfig = OmegaConf.to_object(merged)
    except (OSError, OmegaConfBaseException, ValueError) as exc:
        raise RecipeError(f"{path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
    if not config.stages or not config.methods:
        raise RecipeError(f"{path}: an arena needs stages and methods")
    root = path.resolve().parent
    for stage in config.stages:  # relative to the arena file; the methods' curricula live elsewhere
        stage.recipe = str((root / stage.recipe).resolve())
        stage.eval_size = config.eval_size if stage.eval_size is None else stage.eval_size
        if stage.eval_size < 1:
            raise RecipeError(f"{path}: stage {stage.name}: eval_size must be positive, got {stage.eval_size}")
        # the stage's own held-out records are the ones the arena evaluates: a training record is never one
        stage.overrides = [*stage.overrides, f"cluster.local.eval_size={stage.eval_size}"]
    return config


def seed_dir(config: ArenaConfig) -> Path:
    return Path(config.output_dir).resolve() / f"seed_{config.seed}"


def stage_overrides(config: ArenaConfig) -> list[str]:
    """What every stage of every method gets: the local backend, the data, the arena's sizes, the seed."""
    data = [f"++env_config.{tag}.data_dir={folder}" for tag, folder in config.data.items()]
    return ["cluster=local", *data, *config.overrides, f"++cluster.local.seed={config.seed}"]


def domain_sessions(config: ArenaConfig, *extra: str) -> list[LocalSession]:
    """Each stage's local session as its recipe composes (its env, env settings and budgets); ``extra``: further
    overrides of every stage's recipe (the base's warm start)."""
    out = []
    for stage in config.stages:
        overrides = [*stage_overrides(config), *stage.overrides, f"paths.runs={seed_dir(config) / 'probe'}", *extra]
        session = open_session(load_recipe(stage.recipe, overrides, local_profile(overrides, always=True)))
        if session.env != stage.name:
            raise RecipeError(f"arena stage {stage.name!r} trains env {session.env!r}: name each stage by its env tag")
        out.append(session)
    return out


def held_out_suite(sessions: Sequence[LocalSession]) -> EvalSuite:
    """Every domain's held-out demo prompts (its stage's ``eval_size`` of the records every local stage leaves
    out of training), greedy; ``sessions``: each stage's (:func:`~aclarena_slime.local.session.open_session`)."""
    datasets = tuple(
        EvalDataset(
            name=s.env,
            env=s.env,
            demo=s.records.eval_size,
            temperature=0.0,
            max_response_len=s.eval_response_len,
            env_config=dict(s.records.env_config),
        )  # fmt: skip
        for s in sessions
    )
    return EvalSuite("arena", datasets)


def policy_evaluator(suite: EvalSuite, seed: int, memo: Path | None = None) -> Evaluator:
    """Evaluate a finished stage's policy on ``suite``: its model folder (full fine-tuning: the policy itself),
    with the curriculum's experts so far loaded and routed by tag (a domain without one runs on the model).
    ``memo``: a folder of results by weights (:mod:`aclarena_slime.evaluation.memo`), so a domain asked of
    unchanged weights (MLE's frozen backbone, an earlier expert) is not rolled out again."""

    def evaluate(stage: str, entry: dict[str, Any], out: Path) -> Path:
        model = entry.get("checkpoint") or (entry.get("metrics") or {}).get("model_dir")
        if not model:
            raise ValueError(f"stage {stage} left no model folder to evaluate")
        return asyncio.run(evaluate_policy(suite, Path(model), entry.get("experts") or None, out, stage, seed, memo))

    return evaluate


def method_curriculum(config: ArenaConfig, name: str, base: Path) -> tuple[dict[str, Any], bool]:
    """The curriculum mapping method ``name`` makes of the arena's stages, and whether its stages are
    independent models (the oracles)."""
    made = load_method(config.methods[name].method)(config.stages, dict(config.methods[name].options))
    if not isinstance(made, dict) or not made.get("stages"):
        raise MethodError(f"method {name} ({config.methods[name].method}) returned no stages")
    independent = bool(made.pop("independent", False))
    curriculum = {
        "name": f"{config.name}_{name}",
        "output_dir": str(seed_dir(config) / name),
        "overrides": [*stage_overrides(config), f"checkpoint.load={base}"],
        "base": "base",
        "reuse": str(seed_dir(config) / REUSE),  # a stage two methods share runs once (curriculum/reuse.py)
        **made,
    }
    return curriculum, independent


def run_arena(
    file: str | Path, overrides: list[str] | tuple[str, ...] = (), only: list[str] | None = None
) -> dict[str, Any]:
    """Run the arena for the file's seed (every method, or ``only`` these); returns what ``arena.json`` holds."""
    config = load_arena(file, overrides)
    unknown = sorted(set(only or ()) - set(config.methods))
    if unknown:
        raise RecipeError(f"{file}: no method {unknown}; known: {sorted(config.methods)}")
    out = seed_dir(config)
    suite = held_out_suite(domain_sessions(config))
    # the base's warm start: each domain with gold demos, at the base's steps and records (and the arena's seed, as
    # every stage); a domain without gold demos has none (the stages' own warnings were said above)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warm = domain_sessions(config, f"++cluster.local.warm_start_steps={config.base.steps}",
                               f"++cluster.local.warm_start_records={config.base.records}")  # fmt: skip
    base = build_base([s for s in warm if s.warm_start is not None], config.base, out / "base", config.seed)
    base_eval = out / "base" / "eval"
    if not (base_eval / "summary.json").is_file():
        asyncio.run(evaluate_policy(suite, base, None, base_eval, "base", config.seed, out / EVAL_MEMO))
    index_path = out / ARENA_FILE
    index: dict[str, Any] = {"name": config.name, "seed": config.seed, "base_model": str(base),
                             "base_eval": str(base_eval / "summary.json"), "methods": {}}  # fmt: skip
    if index_path.is_file():
        index["methods"] = yaml.safe_load(index_path.read_text()).get("methods", {})
    for name in only or list(config.methods):
        curriculum, independent = method_curriculum(config, name, base)
        path = Path(curriculum["output_dir"]) / "curriculum.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(curriculum, sort_keys=False))
        print(f"[arena] seed {config.seed}: method {name} ({path})", file=sys.stderr)
        manifest = run_curriculum(path, evaluator=policy_evaluator(suite, config.seed, out / EVAL_MEMO))
        index["methods"][name] = {"manifest": str(manifest.path), "independent": independent,
                                  "method": config.methods[name].method}  # fmt: skip
        write_json_atomic(index_path, index)
    return index


def matrix_command(index: dict[str, Any], out: Path) -> list[str]:
    """The ``aclarena eval matrix`` command that compares an arena seed's methods."""
    runs = [f"--run={name}={entry['manifest']}" for name, entry in index["methods"].items()]
    return ["aclarena", "eval", "matrix", *runs, "--base", index["base_eval"], "--out", str(out)]


def main(argv: list[str] | None = None) -> int:
    import argparse

    from aclarena_slime.curriculum.runner import CurriculumFailed, exit_on_signals

    parser = argparse.ArgumentParser(prog="launch/curriculum.sh", description="Run an arena: every method, one seed.")
    parser.add_argument("arena", help="recipes/curriculum/arena_local.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the arena file, e.g. seed=1")
    parser.add_argument("--methods", nargs="+", help="only these methods (default: all)")
    args = parser.parse_intermixed_args(argv)
    exit_on_signals()  # as one curriculum: a stopped arena stops its job and its evaluation
    try:
        index = run_arena(args.arena, args.overrides, args.methods)
    except (RecipeError, MethodError, CurriculumFailed, ValueError) as exc:
        print(f"curriculum.sh: {exc}", file=sys.stderr)
        return 1
    out = Path(index["base_model"]).parents[1] / "comparison"
    print(f"[arena] done; compare the methods with:\n  {' '.join(matrix_command(index, out))}", file=sys.stderr)
    return 0
