"""Run a curriculum: stages in order, each started from its source's output, with resume and evaluation.

The stage runner and the evaluator are parameters (a test passes fakes); by default a stage runs through
the same code as ``launch/stage.sh`` and evaluation runs the curriculum's ``evaluation.command``.
A stage marked done in the manifest is never run again (only its evaluation, when that did not finish);
a stage that was running when the process died is run again from its start, except that a LoRA stage
resumes its adapter and optimizer state from the last adapter checkpoint under its ``checkpoint.save``
(``aclarena_slime.lora.checkpoint``; the manifest records the iteration). A stage that the local
backend runs gets the local profile, as ``launch/stage.sh`` gives it. A curriculum with a ``reuse`` folder
takes a stage that another curriculum already finished identically from it (:mod:`.reuse`).

"Done" means done and registered: an expert stage is recorded done in the same manifest write that registers
its expert, and a rerun re-registers a done stage whose expert is missing. One run at a time holds the output
folder (a lock naming its pid). An evaluation cut short resumes; the evaluation command runs in its own process
group, stopped with the curriculum (and, for ``kill -9`` of the curriculum, sent SIGTERM by the kernel).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from aclarena_slime.curriculum import reuse
from aclarena_slime.curriculum.config import (
    CurriculumConfig,
    StageEntry,
    load_curriculum,
    recipe_path,
)
from aclarena_slime.curriculum.cost import stage_cost
from aclarena_slime.curriculum.distill_step import data_path, distill_overrides, dump_dir, make_stage_data
from aclarena_slime.curriculum.manifest import DONE, FAILED, MANIFEST_NAME, RUNNING, Manifest
from aclarena_slime.curriculum.sections import anchor_overrides, attach_monitor, attach_replay, lineage_overrides
from aclarena_slime.experts import EXPERTS_NAME, ExpertError
from aclarena_slime.launcher.backend import BackendUnavailable, choose_backend
from aclarena_slime.launcher.hf_export import ExportError
from aclarena_slime.launcher.ray_job import RayError, slime_head
from aclarena_slime.launcher.stage import StageResult, exit_on_signals, local_profile, normalise_overrides
from aclarena_slime.lora.checkpoint import adapter_checkpoint_root, latest_iteration
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.recipes.flags import UnknownFlagError
from aclarena_slime.recipes.lineage import check_ckpt_step
from aclarena_slime.recipes.schema import StageRecipe

StageRunner = Callable[[StageRecipe], StageResult]
HeadHolder = Callable[[list[StageRecipe]], AbstractContextManager[Any]]
# (stage name, its manifest entry, results folder) -> path of summary.json, or None when not evaluated
Evaluator = Callable[[str, dict[str, Any], Path], "Path | None"]
LOCK_NAME = ".curriculum.lock"
EVAL_STOP_WAIT_S = 10.0  # how long a stopped evaluation may take to exit before it is killed
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class CurriculumFailed(RuntimeError):
    pass


def default_stage_runner(recipe: StageRecipe) -> StageResult:
    from aclarena_slime.launcher.stage import run_recipe

    choice = choose_backend(recipe.cluster.backend)
    print(f"[curriculum] {recipe.name}: backend {choice.name} ({choice.reason})", file=sys.stderr)
    return run_recipe(recipe, choice)


def command_evaluator(command: list[str]) -> Evaluator:
    """Run ``command`` (placeholders filled from the stage's entry) after each stage.

    When ``{out}`` already holds samples (an evaluation cut short), ``--resume`` is added, as ``aclarena eval
    run`` takes it: the run redoes only what is missing instead of refusing the folder.
    """

    def evaluate(stage: str, entry: dict[str, Any], out: Path) -> Path | None:
        if not command:
            return None
        out.mkdir(parents=True, exist_ok=True)
        values = {
            "python": sys.executable,
            "stage": stage,
            "checkpoint": entry.get("checkpoint") or "",
            # the model to serve: a checkpoint, or the local backend's base model (its adapter is an expert)
            "model": entry.get("checkpoint") or (entry.get("metrics") or {}).get("model_dir") or "",
            "adapter": entry.get("adapter") or "",
            "experts": entry.get("experts") or "",
            "out": str(out),
        }
        argv = [part.format(**values) for part in command]
        if "--resume" not in argv and any((out / "samples").glob("*.jsonl")):
            argv.append("--resume")
        print(f"[curriculum] evaluating {stage}: {' '.join(argv)}", file=sys.stderr)
        if run_child(argv) != 0:
            raise CurriculumFailed(f"evaluation of {stage} failed: {' '.join(argv)}")
        summary = out / "summary.json"
        return summary if summary.exists() else None

    return evaluate


def run_child(argv: list[str]) -> int:
    """Run ``argv`` in its own process group and wait; if the wait ends any other way (an exception, a signal
    turned into one by :func:`exit_on_signals`), the whole group is stopped: an evaluation holds an engine."""
    child = subprocess.Popen(argv, start_new_session=True, preexec_fn=_die_with_parent())
    try:
        return child.wait()
    finally:
        if child.poll() is None:
            _stop_group(child)


def _die_with_parent() -> Callable[[], None] | None:
    """What the child runs before ``exec``: SIGTERM to it when the curriculum dies, even by ``kill -9`` (Linux's
    ``prctl(PR_SET_PDEATHSIG)``; elsewhere None). Looked up here, in the parent: the child only calls it."""
    import ctypes
    import functools

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return functools.partial(prctl, _PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _stop_group(child: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=EVAL_STOP_WAIT_S)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def output_lock(output_dir: Path) -> Iterator[None]:
    """Hold ``output_dir`` for this run: a second run of the curriculum into the same folders is refused, naming
    the pid that holds it (an advisory ``flock``, released by the kernel when the holder dies)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise CurriculumFailed(
                f"{output_dir} is in use by another run of a curriculum (pid {holder}, lock {path}); wait for it to "
                "end or choose another output_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def stage_recipe(config: CurriculumConfig, file: Path, entry: StageEntry, source: dict[str, Any] | None) -> StageRecipe:
    """The recipe the stage runs; on the local backend with the local profile (else paper settings, services)."""
    path = recipe_path(file, entry)
    overrides = [
        f"paths.runs={Path(config.output_dir) / 'runs'}",
        *normalise_overrides(list(config.overrides)),
        *lineage_overrides(source),
        *normalise_overrides(list(entry.overrides)),
        *anchor_overrides(config.kl_anchor, source),
        *distill_overrides(config.output_dir, entry.name, entry.distill),
        f"name={entry.name}",
    ]
    recipe = load_recipe(path, overrides, local_profile(overrides))
    handed = f"model.hf_checkpoint={(source or {}).get('hf_checkpoint')}"
    if recipe.checkpoint.ckpt_step is not None and handed in overrides:
        # An earlier iteration than the source's last: the source's HF export is not its weights; the recipe
        # names the export of its own iteration (e.g. the MLE experts on an early SDFT checkpoint).
        overrides.remove(handed)
        recipe = load_recipe(path, overrides, local_profile(overrides))
    return recipe


def slime_recipes(recipes: list[StageRecipe]) -> list[StageRecipe]:
    """The stages the slime backend runs (what the curriculum's Ray head serves): the stage runner's choice."""
    out = []
    for recipe in recipes:
        try:
            if choose_backend(recipe.cluster.backend).name == "slime":
                out.append(recipe)
        except BackendUnavailable:
            continue  # the stage runner reports it
    return out


def run_curriculum(
    file: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    runner: StageRunner = default_stage_runner,
    evaluator: Evaluator | None = None,
    head: HeadHolder = slime_head,
) -> Manifest:
    """Run every stage not yet done; returns the manifest. Raises :class:`CurriculumFailed` on a failed stage.

    ``head`` holds one Ray head for all of the slime stages (started before the first, stopped after the last,
    only if started here): a stage stopping it would drop the nodes joined to it (``launch/join.sh``).
    """
    file = Path(file)
    config = load_curriculum(file, overrides)
    # Build every recipe first: a typo in stage 4 should fail now, not after three days of training.
    built = {entry.name: stage_recipe(config, file, entry, None) for entry in config.stages}
    for before, entry in zip([None, *config.stages], config.stages, strict=False):
        source = before.name if entry.start == "previous" and before else entry.start
        if source in built:  # an iteration of the stage it starts from: one that stage writes
            check_ckpt_step(built[entry.name], built[source])
    _check_expert_paths(config, built)
    with output_lock(Path(config.output_dir)), head(slime_recipes(list(built.values()))):
        return _run_stages(config, file, runner, evaluator)


def expert_adapter(recipe: StageRecipe) -> str | None:
    """Where the stage's backend writes the adapter its expert is (None: no adapter, or no backend here)."""
    try:
        backend = choose_backend(recipe.cluster.backend).name
    except BackendUnavailable:
        return None  # the stage runner reports it
    if backend == "local":
        return f"{recipe.run_dir}/local"  # the local backend's outputs, its adapter among them
    if not recipe.lora.enabled:
        return None
    sync_dir = recipe.lora.sync_dir or f"{recipe.checkpoint.save}/adapters"  # as the compiler resolves it
    return f"{sync_dir}/{recipe.lora.adapter_name or recipe.data.env}"


def _check_expert_paths(config: CurriculumConfig, built: dict[str, StageRecipe]) -> None:
    """Every expert's adapter inside the output folder, checked before anything trains."""
    manifest = Manifest(Path(config.output_dir) / MANIFEST_NAME)
    for entry in config.stages:
        adapter = expert_adapter(built[entry.name]) if entry.expert else None
        if adapter is not None:
            try:
                manifest.check_expert_path(adapter, entry.name)
            except ExpertError as exc:
                raise CurriculumFailed(str(exc)) from exc


def _run_stages(config: CurriculumConfig, file: Path, runner: StageRunner, evaluator: Evaluator | None) -> Manifest:
    out = Path(config.output_dir)
    evaluator = evaluator or command_evaluator(list(config.evaluation.command))
    _check_replay_exclude(config, file)
    manifest = Manifest.open(out, config.name)
    previous: str | None = None
    for entry in config.stages:
        source_name = previous if entry.start == "previous" else (None if entry.start == "recipe" else entry.start)
        if manifest.is_done(entry.name):
            if entry.expert and not manifest.has_expert(entry.expert, entry.name):
                _repair_expert(config, file, manifest, entry, source_name, out)
            record = manifest.stage(entry.name) or {}
            if record.get("eval") or record.get("eval_note"):
                print(f"[curriculum] {entry.name}: done earlier, skipped", file=sys.stderr)
            else:  # trained, but its evaluation failed or was interrupted
                print(f"[curriculum] {entry.name}: done earlier; evaluating it again", file=sys.stderr)
                _evaluate(manifest, evaluator, entry.name, out, bool(config.evaluation.command))
            previous = entry.name
            continue
        source = manifest.stage(source_name) if source_name else None
        if source_name and (source is None or source.get("status") != DONE):
            raise CurriculumFailed(f"stage {entry.name} starts from {source_name}, which has not finished")
        recipe = stage_recipe(config, file, entry, source)
        before = config.stages[: config.stages.index(entry)]
        # the earlier stages' recipes lend their envs (and services) to replay and to the monitor's checks
        needs_earlier = config.replay.enabled or config.monitor.enabled
        earlier = [stage_recipe(config, file, e, None) for e in before] if needs_earlier else []
        attach_monitor(recipe, config.monitor, [(manifest.stage(e.name) or {}).get("env") or "" for e in before],
                       earlier)  # fmt: skip
        if config.replay.enabled:
            attach_replay(recipe, config.replay, earlier)
        key = _fingerprint(config, manifest, entry, recipe, source) if config.reuse else None
        found = reuse.find(config.reuse, key)
        if found is not None:
            _adopt(manifest, entry, recipe, source, source_name, found, key, out)
            previous = entry.name
            continue
        resumed = latest_iteration(adapter_checkpoint_root(recipe.checkpoint.save)) if recipe.lora.enabled else None
        if resumed is not None:
            print(f"[curriculum] {entry.name}: resuming its adapter from iteration {resumed}", file=sys.stderr)
        manifest.update_stage(
            entry.name, recipe=entry.recipe, env=recipe.data.env, start_from=source_name,
            loaded=(source or {}).get("checkpoint") or (source or {}).get("adapter") or recipe.checkpoint.load,
            ref_load=recipe.checkpoint.ref_load if recipe.algorithm.use_kl_loss else None,
            status=RUNNING, started_at=time.time(), resumed_adapter_iteration=resumed, fingerprint=key,
        )  # fmt: skip
        _distill(entry, recipe, manifest, out)
        result = runner(recipe)
        if result.status != 0:
            manifest.update_stage(
                entry.name, status=FAILED, exit_status=result.status, backend=result.backend, message=result.message
            )
            raise CurriculumFailed(
                f"stage {entry.name} failed with status {result.status}"
                + (f": {result.message}" if result.message else "")
            )
        if entry.expert and not result.adapter:
            message = f"stage {entry.name} is the {entry.expert!r} expert but produced no adapter"
            manifest.update_stage(entry.name, status=FAILED, backend=result.backend, message=message)
            raise CurriculumFailed(message)
        expert = _expert(entry, recipe, source, source_name, result.adapter, out) if entry.expert else None
        manifest.finish_stage(
            entry.name, expert=expert, status=DONE, backend=result.backend, checkpoint=result.checkpoint,
            hf_checkpoint=result.hf_checkpoint, adapter=result.adapter, metrics=_small(result.metrics),
            monitor=(result.metrics or {}).get("monitor"), cost=stage_cost(recipe, result.metrics),
            finished_at=time.time(), dumps=dump_dir(recipe),
        )  # fmt: skip
        _evaluate(manifest, evaluator, entry.name, out, bool(config.evaluation.command))
        done = manifest.stage(entry.name) or {}
        if key and config.reuse and done.get("eval"):
            reuse.record(config.reuse, key, config.name, done, out)
        previous = entry.name
    return manifest


def _check_replay_exclude(config: CurriculumConfig, file: Path) -> None:
    """A ``replay.exclude`` tag that no stage trains (a typo) would leave that domain replayed: refuse it before
    anything trains."""
    if not (config.replay.enabled and config.replay.exclude):
        return
    envs = list(dict.fromkeys(stage_recipe(config, file, e, None).data.env for e in config.stages))
    unknown = [tag for tag in config.replay.exclude if tag not in envs]
    if unknown:
        raise CurriculumFailed(
            f"replay.exclude names {unknown}, which no stage trains; the stages train {', '.join(envs)}"
        )


def _expert(
    entry: StageEntry,
    recipe: StageRecipe,
    source: dict[str, Any] | None,
    source_name: str | None,
    adapter: str,
    out: Path,
) -> tuple[str, str, dict[str, Any]]:
    """The stage's adapter as the expert of its tag, with the weights it was trained on (``Manifest.finish_stage``)."""
    # The weights the expert was trained on, as SGLang loads them: the HF export when there is one.
    base_path = (source or {}).get("hf_checkpoint") or (source or {}).get("checkpoint") or ""
    if recipe.checkpoint.ckpt_step is not None:  # an earlier iteration's export (see stage_recipe)
        base_path = recipe.model.hf_checkpoint
    return entry.expert or "", _relative(adapter, out), {"name": source_name or "base", "path": base_path}


def _repair_expert(
    config: CurriculumConfig, file: Path, manifest: Manifest, entry: StageEntry, source_name: str | None, out: Path
) -> None:
    """A stage recorded done whose expert is missing (a crash between the two, before this was one write): register
    it from the stage's recorded adapter, and evaluate the stage again (an evaluation made without the expert ran
    on the base model; its folder is kept aside)."""
    record = manifest.stage(entry.name) or {}
    adapter = record.get("adapter")
    if not adapter:
        raise CurriculumFailed(
            f"stage {entry.name} is recorded done but has no adapter for its {entry.expert!r} expert; "
            f"remove its entry from {manifest.path} to train it again"
        )
    print(f"[curriculum] {entry.name}: done earlier but its {entry.expert!r} expert is missing; registering it",
          file=sys.stderr)  # fmt: skip
    source = manifest.stage(source_name) if source_name else None
    recipe = stage_recipe(config, file, entry, source)
    folder = out / "eval" / entry.name
    if folder.exists():
        folder.rename(folder.with_name(f"{entry.name}.without-expert-{int(time.time())}"))
    manifest.finish_stage(entry.name, expert=_expert(entry, recipe, source, source_name, adapter, out),
                          eval=None, eval_note=None)  # fmt: skip


def _fingerprint(
    config: CurriculumConfig, manifest: Manifest, entry: StageEntry, recipe: StageRecipe, source: dict[str, Any] | None
) -> str | None:
    """The stage's fingerprint: its recipe, its evaluation, and the stages whose outputs it reads (the one it
    starts from, those whose experts are served beside it, those whose dumps it distills)."""
    read = {e["stage"] for e in manifest.data["experts"].values()} | set((entry.distill.dumps if entry.distill
                                                                            else {}).values())  # fmt: skip
    inputs = [(source or {}).get("fingerprint") if source else "",
              *((manifest.stage(name) or {}).get("fingerprint") for name in sorted(read))]  # fmt: skip
    return reuse.fingerprint(recipe, config.output_dir, inputs, list(config.evaluation.command))


def _adopt(
    manifest: Manifest,
    entry: StageEntry,
    recipe: StageRecipe,
    source: dict[str, Any] | None,
    source_name: str | None,
    found: dict[str, Any],
    key: str | None,
    out: Path,
) -> None:
    """Take a finished identical stage (``found``, from the reuse folder) as this stage's result."""
    stored = {k: v for k, v in found["entry"].items() if k not in ("name", "fingerprint", "reused_from")}
    origin = f"{found['curriculum']}:{found['stage']}"
    print(f"[curriculum] {entry.name}: identical to {origin}, finished earlier; reused", file=sys.stderr)
    if entry.expert:
        if not stored.get("adapter"):
            raise CurriculumFailed(f"stage {entry.name} is the {entry.expert!r} expert but {origin} has no adapter")
        copy = out / "reused" / entry.name / "adapter"  # the expert manifest names adapters inside its folder
        shutil.copytree(stored["adapter"], copy, dirs_exist_ok=True)
        stored["adapter"] = str(copy)
    expert = _expert(entry, recipe, source, source_name, stored["adapter"], out) if entry.expert else None
    manifest.finish_stage(entry.name, expert=expert, **stored, fingerprint=key, reused_from=origin)


def _distill(entry: StageEntry, recipe: StageRecipe, manifest: Manifest, out: Path) -> None:
    """The stage's training data from earlier stages' rollout dumps (``distill`` in its entry), made now."""
    if entry.distill is None:
        return
    stages = {name: manifest.stage(name) or {} for name in entry.distill.dumps.values()}
    try:
        made = make_stage_data(entry.distill, recipe, stages, data_path(out, entry.name))
    except ValueError as exc:
        manifest.update_stage(entry.name, status=FAILED, message=str(exc))
        raise CurriculumFailed(f"stage {entry.name}: {exc}") from exc
    manifest.update_stage(entry.name, data=made)


def _evaluate(manifest: Manifest, evaluator: Evaluator, stage: str, out: Path, has_command: bool) -> None:
    """Evaluate a finished stage and record the summary (or why there is none) in the manifest."""
    record = manifest.stage(stage) or {}
    experts = str(manifest.path.with_name(EXPERTS_NAME)) if manifest.data["experts"] else ""
    summary = evaluator(stage, {**record, "experts": experts}, out / "eval" / stage)
    note = None
    if summary is None:
        note = "the evaluation wrote no summary.json" if has_command else "no evaluation.command"
    manifest.update_stage(stage, eval={"summary": _relative(str(summary), out)} if summary else None, eval_note=note)


def _relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path


def _small(metrics: dict[str, Any]) -> dict[str, Any]:
    """Scalars only: the manifest stays readable; full metrics live in the stage's folder."""
    return {k: v for k, v in (metrics or {}).items() if isinstance(v, int | float | str | bool)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launch/curriculum.sh", description="Run a curriculum's stages in order.")
    parser.add_argument("curriculum", help="recipes/curriculum/<name>.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the curriculum file, e.g. output_dir=/runs/x")
    args = parser.parse_intermixed_args(argv)
    exit_on_signals()
    try:
        manifest = run_curriculum(args.curriculum, args.overrides)
    except (RecipeError, UnknownFlagError, CurriculumFailed, ValueError, RayError, ExportError) as exc:
        print(f"curriculum.sh: {exc}", file=sys.stderr)
        return 1
    print(f"[curriculum] all stages done; manifest: {manifest.path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
