"""``aclarena doctor RECIPE [overrides]``: check a cluster for a recipe before a run spends GPU hours."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from aclarena_slime.cli import CommandError

if TYPE_CHECKING:
    from aclarena_slime.launcher.preflight import Check
    from aclarena_slime.recipes.schema import StageRecipe


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="pre-flight checks of a recipe on this cluster (also: launch/stage.sh RECIPE --preflight)",
        description=(
            "Check, on the head node, what a slime run of RECIPE needs: versions, every flag against the "
            "installed parsers, hooks, Ray nodes and GPUs, services and the LoRA sync folder from every node, "
            "data through the env, tokenizer, checkpoint format, LoRA combinations. Exit 1 on any failure."
        ),
    )
    parser.add_argument("recipe", help="recipes/<stage>.yaml")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for launch/stage.sh")
    parser.add_argument("--no-cluster", action="store_true", help="skip the checks that need the Ray cluster")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from aclarena_slime.launcher import preflight
    from aclarena_slime.launcher.stage import normalise_overrides
    from aclarena_slime.recipes.compiler import compile_recipe
    from aclarena_slime.recipes.compose import RecipeError, load_recipe
    from aclarena_slime.recipes.flags import UnknownFlagError

    try:
        recipe = load_recipe(args.recipe, normalise_overrides(args.overrides))
        command = compile_recipe(recipe)
    except (RecipeError, UnknownFlagError) as exc:
        raise CommandError(str(exc)) from exc
    checks = preflight.recipe_checks(recipe, command)
    if recipe.cluster.backend == "local":  # cluster=local: the parity check runs here, always (no GPU needed)
        checks.append(local_parity_check(recipe))
    if not args.no_cluster:
        from aclarena_slime.launcher.preflight_cluster import cluster_checks

        checks += cluster_checks(recipe, command.runtime_env)
    if args.json:
        print(preflight.as_json(checks))
    else:
        for check in checks:
            print(check.line())
        bad = sum(c.status == "fail" for c in checks)
        print(f"{len(checks)} checks: {bad} failed" if bad else f"{len(checks)} checks: all passed")
    return 1 if preflight.failed(checks) else 0


def local_parity_check(recipe: StageRecipe) -> Check:
    """The engine's log-probs of a few rollouts against the trainer's recompute, on the local backend
    (:mod:`aclarena_slime.local.parity_probe`); on slime the job checks its first batch itself."""
    from aclarena_slime.launcher.preflight import Check
    from aclarena_slime.local.parity_probe import run_probe
    from aclarena_slime.local.session import open_session
    from aclarena_slime.recipes.compose import RecipeError

    try:
        report = run_probe(open_session(recipe))
    except RecipeError as exc:
        return Check("log-prob parity", "fail", f"the local backend cannot run this recipe: {exc}", "fix the recipe")
    fix = "the engine does not serve what the trainer holds: check the adapter, template and temperature"
    return Check("log-prob parity", "ok" if report["ok"] else "fail", report["line"], "" if report["ok"] else fix)
