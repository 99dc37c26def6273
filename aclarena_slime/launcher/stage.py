"""``bash launch/stage.sh RECIPE [overrides...] [--dry-run]``: one stage, on slime or on the local backend.

slime: make the HF export the stage serves when it is missing, start (or reuse) the Ray head, wait briefly for
the GPUs the recipe needs (failing with the missing count and the join command), start the recipe's services,
write the custom-config YAML, submit the job with the runtime env, stream its logs, stop only what was started
here (a curriculum's head stays up for its next stage), exit with the job's status.
local: run the recipe's env on the embedded engine (no GPU, no slime) and say so.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from aclarena_slime.launcher.backend import BackendChoice, BackendUnavailable, choose_backend, runs_local
from aclarena_slime.recipes.addresses import AddressError, nodes_needed, require_head_address
from aclarena_slime.recipes.compose import Adjust, RecipeError, load_recipe
from aclarena_slime.recipes.schema import StageRecipe

STOP_TRIES = 3  # ``ray job stop`` attempts when a service the job needs is beyond repair


@dataclass
class StageResult:
    """What a finished stage leaves behind, for the curriculum's lineage."""

    status: int
    backend: str
    checkpoint: str | None = None
    adapter: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    hf_checkpoint: str | None = None  # HF export of the weights (checkpoint.save_hf): what later stages serve
    message: str | None = None  # why a finished job still failed the stage


def normalise_overrides(overrides: list[str]) -> list[str]:
    """``backend=X`` is shorthand for ``cluster.backend=X``; ``cluster.local.*`` settings imply ``cluster=local``."""
    out = [f"cluster.{item}" if item.startswith("backend=") else item for item in overrides]
    if any(item.startswith("cluster.local.") for item in out) and not any(item.startswith("cluster=") for item in out):
        out.insert(0, "cluster=local")
    return out


def local_profile(overrides: list[str], always: bool = False) -> Adjust:
    """What a run on the local backend adds to its recipe (``load_recipe``'s ``adjust``): the ``cluster=local``
    profile and the working directory as ``paths.root`` (outputs in ``./runs``), unless the user named either.
    Applied when the local backend runs the recipe here (:func:`runs_local`), or ``always``."""

    def adjust(choices: DictConfig) -> list[str]:
        if not (always or runs_local(choices)):
            return []
        extra = []
        if choices.cluster.name != "local" and not any(item.startswith("cluster=") for item in overrides):
            extra.append("cluster=local")
        if not any(item.startswith("paths.root=") for item in overrides):
            extra.append(f"paths.root={Path.cwd()}")
        return extra

    return adjust


def head_text(recipe: StageRecipe) -> str:
    """Where the Ray head listens and how other nodes join it (or why there is no address)."""
    ray, nodes = recipe.cluster.ray, nodes_needed(recipe.cluster)
    if ray.address is None:
        return f"# ray head: NONE ({nodes} nodes and no routable address here: set cluster.ray.address=HEAD_IP)"
    text = f"# ray head address: {ray.address} ({nodes} node{'s' if nodes > 1 else ''}"
    if nodes > 1:
        text += f"; on each other node: bash launch/join.sh {ray.address} --port {ray.port}"
    return text + ")"


def dry_run_text(recipe: StageRecipe, choice: BackendChoice, local_recipe: StageRecipe | None = None) -> str:
    """What will run: the local plan (the stage's resolved settings) or the exact slime command."""
    lines = [f"# recipe {recipe.name}: {recipe.notes}".rstrip(": "), f"# backend here: {choice.name} ({choice.reason})"]
    if local_recipe is not None:
        from aclarena_slime.local.run import local_plan
        from aclarena_slime.local.session import open_session

        try:
            lines.append(local_plan(open_session(local_recipe)))
            return "\n".join(lines)
        except RecipeError as exc:  # say why, then show what the slime backend would run
            lines.append(f"# the local backend cannot run this stage: {exc}; on the slime backend:")
    elif choice.name == "local":
        lines.append(f"# the local backend cannot run this stage: it runs RL and SFT stages, this one is kind "
                     f"{recipe.kind!r}; on the slime backend:")  # fmt: skip
    from aclarena_slime.launcher.hf_export import export_argv
    from aclarena_slime.recipes.compiler import compile_recipe

    command = compile_recipe(recipe)
    dashboard = f"http://{recipe.cluster.ray.address or 'HEAD_IP'}:{recipe.cluster.ray.dashboard_port}"
    lines.append(head_text(recipe))
    if recipe.checkpoint.ckpt_step is not None:
        argv = export_argv(recipe, recipe.model.hf_checkpoint)
        lines.append(f"# HF export SGLang serves (made before the job when missing): {' '.join(argv)}")
    for name, service in command.services.items():
        from aclarena_slime.launcher.services import service_command

        env = "".join(f"{k}={v} " for k, v in service.env.items())
        lines.append(f"# service {name} at {service.url} (watched, at most {service.max_restarts} restarts): "
                     f"{env}{' '.join(service_command(service))}")  # fmt: skip
    lines.append(f"# {command.custom_config_path}:")
    lines += ["#   " + line for line in json.dumps(command.custom_config, indent=2).splitlines()]
    lines.append(command.shell(dashboard))
    return "\n".join(lines)


def run_recipe(recipe: StageRecipe, choice: BackendChoice) -> StageResult:
    """Run one composed stage on the chosen backend (no dry run)."""
    if choice.name == "local":
        from aclarena_slime.local.run import run_local

        out = run_local(recipe)
        if out["full"]:  # a fully fine-tuned model: the next stage loads it as its checkpoint
            return StageResult(
                0, "local", checkpoint=out["policy"], hf_checkpoint=out["policy"], metrics=out["metrics"]
            )
        return StageResult(0, "local", adapter=out["policy"], metrics=out["metrics"])
    from aclarena_slime.launcher.hf_export import ensure_export
    from aclarena_slime.launcher.services import start_service, stop_service

    # before anything starts: a multi-node run needs an address other nodes reach
    require_head_address(recipe.cluster.ray.address, nodes_needed(recipe.cluster) > 1)
    done = ensure_export(recipe)  # the weights SGLang serves, unpadded, before any engine starts
    if done:
        print(f"[stage] {done}", file=sys.stderr)
    log_dir = Path(recipe.run_dir) / "services"
    started: list[Any] = []  # the watch replaces a restarted service's entry: what runs at the end is stopped
    try:
        for name, service in recipe.services.items():
            started.append(start_service(name, service, log_dir))
        return _run_slime(recipe, started)
    finally:
        for running in reversed(started):
            stop_service(running)


def submit_watched(argv: list[str], dashboard: str, stage_name: str, services: list[Any]) -> tuple[int, str | None]:
    """Submit the job while its services are watched (:class:`~aclarena_slime.launcher.services.ServiceWatch`):
    one that dies past its restarts stops the job (``ray job stop``), and so does this launcher stopping (Ctrl-C,
    SIGTERM/SIGHUP turned into an exit, any exception; ``kill -9`` cannot be caught). The job's status and why
    it was stopped."""
    from aclarena_slime.launcher import ray_job
    from aclarena_slime.launcher.services import ServiceWatch

    submission = ray_job.submission_id(stage_name)

    def stop(_why: str) -> None:  # a job not yet registered, or a busy head: a few tries, then say so
        for _ in range(STOP_TRIES):
            if ray_job.stop_job(dashboard, submission):
                return
            time.sleep(5.0)
        print(f"[stage] could not stop job {submission}: stop it with ray job stop --address={dashboard} "
              f"{submission}", file=sys.stderr)  # fmt: skip

    with ServiceWatch(services, stop) as watch:
        try:
            status = ray_job.submit(argv, submission)
        except BaseException:  # Ctrl-C, SIGTERM/SIGHUP turned into an exit: the submit client dies, the job would not
            print(f"[stage] the launcher is stopping; stopping its job {submission}", file=sys.stderr)
            stop("the launcher stopped")
            raise
    return status, watch.failure


def _run_slime(recipe: StageRecipe, services: list[Any] | None = None) -> StageResult:
    from aclarena_slime.launcher import ray_job
    from aclarena_slime.recipes.compiler import compile_recipe

    ray = recipe.cluster.ray
    command = compile_recipe(recipe)
    command.write_custom_config()
    engines = "--debug-train-only" not in command.train_args
    # A head that answers (a curriculum's, or the user's) is reused and left up; one started here is stopped here.
    dashboard = f"http://{ray.address}:{ray.dashboard_port}"
    with ray_job.held_head(ray, recipe.cluster.num_gpus_per_node):
        ray_job.require_gpus(ray, ray_job.gpus_needed(recipe.cluster, engines))
        status, stopped = submit_watched(command.submit_argv(dashboard), dashboard, recipe.name, services or [])
    result = StageResult(status, "slime", checkpoint=recipe.checkpoint.save, hf_checkpoint=recipe.checkpoint.save_hf)
    read_monitor_report(result, command.custom_config.get("aclarena_monitor"))
    lora = command.custom_config.get("aclarena_lora")
    if lora is not None:
        _check_adapter(result, lora)
    if stopped is not None:  # whatever the job said on its way out: it ran without a service it needs
        result.status = result.status or 1
        result.message = f"the job was stopped: {stopped}"
    return result


def read_monitor_report(result: StageResult, section: dict[str, Any] | None) -> None:
    """The forgetting monitor's report (its eval-log hook writes it at every check) into the stage's metrics;
    a stage its ``stop`` ended (the hook raised, so the job failed) finished as the recipe asked."""
    from aclarena_slime.evaluation.monitor import REPORT_FILE

    path = Path(section["out_dir"], REPORT_FILE) if section else None
    if path is None or not path.is_file():
        return
    report = json.loads(path.read_text())
    result.metrics["monitor"] = report
    if report.get("stopped") and result.status != 0:
        result.status = 0
        alarms = "; ".join(f"{a['domain']} fell {a['drop']} points by rollout {a['step']}" for a in report["alarms"])
        result.message = f"stopped by the forgetting monitor ({alarms}); report: {path}"


def _check_adapter(result: StageResult, lora: dict[str, Any]) -> None:
    """A LoRA stage's output is the PEFT folder its disk sync rewrites after every step; fail without it.

    The updater runs on the trainer's rank 0, which may be another node: sync_dir must be shared.
    """
    adapter = f"{lora['sync_dir']}/{lora['adapter_name']}"
    if Path(adapter, "adapter_config.json").is_file():
        result.adapter = adapter
    elif result.status == 0:
        result.status = 1
        result.message = (
            f"the job finished but left no adapter at {adapter} (sync_mode {lora['sync_mode']!r}: only 'disk' "
            "writes it, after every step; on several nodes lora.sync_dir must be a filesystem this node shares)"
        )


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP end the process as Ctrl-C does, through every ``finally``: the Ray job
    (:func:`submit_watched`), an evaluation's process group and an output lock are released instead of left
    behind. The stage launcher, the curriculum and the arena install it first thing."""

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launch/stage.sh", description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="recipes/<stage>.yaml")
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. algorithm.lr=2e-6 cluster=single_8 backend=local"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print what will run (the exact slime command, or the local plan) and stop",
    )
    args = parser.parse_intermixed_args(argv)
    exit_on_signals()
    try:
        overrides = normalise_overrides(args.overrides)
        recipe = load_recipe(args.recipe, overrides, local_profile(overrides))
        try:
            choice = choose_backend(recipe.cluster.backend)
        except BackendUnavailable:
            if not (args.dry_run and recipe.cluster.backend == "slime"):
                raise
            choice = BackendChoice("slime", "backend=slime requested (a dry run: slime and GPUs are not needed here)")
        print(f"[stage] backend: {choice.name} ({choice.reason})", file=sys.stderr)
        local_recipe = recipe if runs_local(recipe) else None
        if args.dry_run:
            print(dry_run_text(recipe, choice, local_recipe))
            return 0
        if local_recipe is not None:
            print(f"[stage] local backend: cluster={recipe.cluster.name} profile, outputs in {recipe.run_dir}",
                  file=sys.stderr)  # fmt: skip
        result = run_recipe(recipe, choice)
    except (RecipeError, BackendUnavailable, AddressError) as exc:
        print(f"stage.sh: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a service, Ray or the local run failed: one line, not a traceback
        if _slime_setup_error(exc):
            print(f"stage.sh: {exc}", file=sys.stderr)
            return 2
        print(f"stage.sh: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(finished_text(result), file=sys.stderr)
    return result.status


def _slime_setup_error(exc: Exception) -> bool:
    """A slime stage's setup failed (a flag slime lacks, the HF export): imported here, on the error path,
    so a local run never loads the slime side's modules."""
    from aclarena_slime.launcher.hf_export import ExportError
    from aclarena_slime.recipes.flags import UnknownFlagError

    return isinstance(exc, UnknownFlagError | ExportError)


def finished_text(result: StageResult) -> str:
    """The closing lines: where the outputs are and, on the local backend, the held-out reward last
    (``held-out reward: base X -> warm start Y -> trained Z``; no warm start: ``base X -> trained Z``)."""
    parts = [f"[stage] {result.backend} stage finished with status {result.status}"]
    if result.message:
        parts.append(result.message)
    if result.adapter:
        parts.append(f"adapter (PEFT): {result.adapter}")
    if result.checkpoint:
        parts.append(f"checkpoint: {result.checkpoint}")
    if result.hf_checkpoint and result.hf_checkpoint != result.checkpoint:
        parts.append(f"HF export: {result.hf_checkpoint}")
    text = "; ".join(parts)
    rewards = [
        (label, (result.metrics.get(key) or {}).get("mean_reward"))
        for label, key in (("base", "eval_before"), ("warm start", "eval_warm_start"), ("trained", "eval_after"))
        if key in result.metrics
    ]
    if rewards and all(value is not None for _, value in rewards):
        text += how_evaluated(result.metrics)
        text += "\nheld-out reward: " + " -> ".join(f"{label} {value:.3f}" for label, value in rewards)
    return text


def how_evaluated(metrics: dict[str, Any]) -> str:
    """A line saying how the held-out reward was measured, with the greedy one beside a sampled evaluation: the
    two can tell different stories (RL sharpens samples towards what greedy decoding already answers)."""
    after, greedy = metrics.get("eval_after") or {}, metrics.get("eval_greedy") or {}
    if "samples_per_prompt" not in after or not greedy:
        return ""
    line = (f"\nheld-out prompts: {after['prompts']}, {after['samples_per_prompt']} sample(s) each at temperature "
            f"{after.get('temperature', 0.0):g}, top-p {after.get('top_p', 1.0):g}")  # fmt: skip
    values = [(greedy.get(k) or {}).get("mean_reward") for k in ("before", "after")]
    if None not in values:
        line += f" (greedy: warm start {values[0]:.3f} -> trained {values[1]:.3f})"
    return line


if __name__ == "__main__":
    raise SystemExit(main())
