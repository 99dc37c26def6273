"""The curriculum runner with a fake stage runner: lineage, manifest, experts, resume after a crash, and the faults
of a run (a crash before the expert is registered, two runs in one folder, a kill during the evaluation)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from aclarena_slime.curriculum import runner as curriculum_runner
from aclarena_slime.curriculum.config import load_curriculum
from aclarena_slime.curriculum.manifest import DONE, MANIFEST_NAME, Manifest
from aclarena_slime.curriculum.runner import CurriculumFailed, run_curriculum, stage_recipe
from aclarena_slime.launcher.stage import StageResult
from aclarena_slime.recipes.compose import RecipeError
from aclarena_slime.recipes.domains import StagesFrom, plan_stages
from aclarena_slime.recipes.lineage import saves_iteration

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


class FakeRunner:
    """Records what each stage loaded; 'trains' by writing a checkpoint marker; can crash on a stage."""

    def __init__(self, crash_on: str | None = None, adapters: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.recipes: list = []
        self.crash_on = crash_on
        self.adapters = adapters

    def __call__(self, recipe) -> StageResult:
        self.calls.append((recipe.name, recipe.checkpoint.load))
        self.recipes.append(recipe)
        if recipe.name == self.crash_on:
            raise KeyboardInterrupt("simulated crash")  # not an Exception: the process dies mid-stage
        save = Path(recipe.checkpoint.save)
        save.mkdir(parents=True)  # fails if a finished stage were ever redone
        (save / "from.txt").write_text(recipe.checkpoint.load)
        adapter = None
        if recipe.lora.enabled:
            adapter = str(save / "adapter")
            Path(adapter).mkdir()
        hf = recipe.checkpoint.save_hf
        if hf:
            Path(hf).mkdir(parents=True)
        assert recipe.checkpoint.ref_load == recipe.checkpoint.load
        return StageResult(
            0, "fake", checkpoint=str(save), adapter=adapter, metrics={"reward": 0.5, "curve": [1, 2]}, hf_checkpoint=hf
        )


def write_curriculum(tmp_path: Path, name: str, stages: list[str], evaluation: list[str] | None = None) -> Path:
    path = tmp_path / f"{name}.yaml"
    lines = [f"name: {name}", f"output_dir: {tmp_path / 'out'}", f"overrides: ['paths.root={tmp_path}']", "stages:"]
    lines += [f"  - {stage}" for stage in stages]
    lines += ["evaluation:", f"  command: {json.dumps(evaluation or [])}"]
    path.write_text("\n".join(lines) + "\n")
    return path


SEQUENTIAL = [
    f"{{name: s1, recipe: {RECIPES}/stage1_math.yaml}}",
    f"{{name: s2, recipe: {RECIPES}/stage2_search.yaml}}",
    f"{{name: s3, recipe: {RECIPES}/stage3_retail.yaml}}",
    f"{{name: s4, recipe: {RECIPES}/stage4_if.yaml}}",
]


def test_sequential_chain_passes_each_output_to_the_next(tmp_path: Path):
    runner = FakeRunner()
    manifest = run_curriculum(write_curriculum(tmp_path, "seq", SEQUENTIAL), runner=runner, evaluator=lambda *_: None)
    runs = tmp_path / "out" / "runs"
    assert runner.calls == [
        ("s1", str(tmp_path / "models" / "Qwen3-8B-Base_torch_dist")),
        ("s2", str(runs / "s1" / "checkpoint")),
        ("s3", str(runs / "s2" / "checkpoint")),
        ("s4", str(runs / "s3" / "checkpoint")),
    ]
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert [s["name"] for s in data["stages"]] == ["s1", "s2", "s3", "s4"]
    assert [s["env"] for s in data["stages"]] == ["math", "search", "retail", "ifeval"]
    assert all(s["status"] == DONE for s in data["stages"])
    assert data["stages"][1]["start_from"] == "s1" and data["stages"][1]["loaded"] == str(runs / "s1" / "checkpoint")
    assert data["stages"][0]["metrics"] == {"reward": 0.5}  # scalars only
    assert manifest.data == data


def test_resume_after_a_crash_skips_finished_stages(tmp_path: Path):
    path = write_curriculum(tmp_path, "seq", SEQUENTIAL)
    with pytest.raises(KeyboardInterrupt):
        run_curriculum(path, runner=FakeRunner(crash_on="s3"), evaluator=lambda *_: None)
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert [s["status"] for s in data["stages"]] == [DONE, DONE, "running"]

    again = FakeRunner()
    run_curriculum(path, runner=again, evaluator=lambda *_: None)
    runs = tmp_path / "out" / "runs"
    assert again.calls == [("s3", str(runs / "s2" / "checkpoint")), ("s4", str(runs / "s3" / "checkpoint"))]
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert [s["status"] for s in data["stages"]] == [DONE] * 4
    # A third run has nothing left to do.
    idle = FakeRunner()
    run_curriculum(path, runner=idle, evaluator=lambda *_: None)
    assert idle.calls == []


def test_failed_stage_stops_the_curriculum_and_is_recorded(tmp_path: Path):
    class Failing(FakeRunner):
        def __call__(self, recipe):
            return StageResult(3, "fake") if recipe.name == "s2" else super().__call__(recipe)

    with pytest.raises(CurriculumFailed, match="s2 failed with status 3"):
        run_curriculum(write_curriculum(tmp_path, "seq", SEQUENTIAL), runner=Failing(), evaluator=lambda *_: None)
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert [s["status"] for s in data["stages"]] == [DONE, "failed"]


def test_mle_experts_start_from_the_backbone_and_fill_experts_json(tmp_path: Path):
    stages = [
        f"{{name: backbone, recipe: {RECIPES}/sdft_backbone.yaml}}",
        f"{{name: e_math, recipe: {RECIPES}/mle_math.yaml, start: backbone, expert: math}}",
        f"{{name: e_search, recipe: {RECIPES}/mle_search.yaml, start: backbone, expert: search}}",
    ]
    runner = FakeRunner()
    run_curriculum(write_curriculum(tmp_path, "mle", stages), runner=runner, evaluator=lambda *_: None)
    backbone = str(tmp_path / "out" / "runs" / "backbone" / "checkpoint")
    assert [load for _, load in runner.calls[1:]] == [backbone, backbone]
    # SGLang serves the HF export of the SDFT iteration each expert loads, the weights the expert trains on:
    # not the backbone's last export, not Qwen3-8B-Base. One backbone for every expert: the authors' iteration
    # 1000, which slime writes as iter_0000999 (their search LoRA takes 500; recipes/FIDELITY.md says why not).
    assert [r.checkpoint.ckpt_step for r in runner.recipes[1:]] == [999, 999]
    exports = [f"{backbone}/hf_iter_999", f"{backbone}/hf_iter_999"]
    assert [r.model.hf_checkpoint for r in runner.recipes[1:]] == exports
    experts = json.loads((tmp_path / "out" / "experts.json").read_text())
    # inside the run folder, so written relative to it (the folder can move); read back, the export
    assert experts["base"] == {"name": "backbone", "path": "runs/backbone/checkpoint/hf_iter_999"}
    assert experts["experts"]["math"] == {
        "adapter": "math",
        "path": "runs/e_math/checkpoint/adapter",
        "stage": "e_math",
    }
    assert set(experts["experts"]) == {"math", "search"}
    assert experts["base"]["name"] == "backbone" and experts["default"] is None
    from aclarena_slime.experts import ExpertTable

    table = ExpertTable.load(tmp_path / "out" / "experts.json")
    assert table.adapter_for("search") == "search" and table.base_path == Path(exports[-1])


def test_evaluation_step_runs_after_every_stage_and_feeds_the_matrix(tmp_path: Path):
    script = tmp_path / "eval.py"
    script.write_text(
        "import json, pathlib, sys\n"
        "out = pathlib.Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)\n"
        "(out / 'summary.json').write_text(json.dumps({'stage': sys.argv[1]}))\n"
    )
    import sys

    stages = SEQUENTIAL[:2]
    path = write_curriculum(tmp_path, "seq", stages, evaluation=[sys.executable, str(script), "{stage}", "{out}"])
    run_curriculum(path, runner=FakeRunner())
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert [s["eval"] for s in data["stages"]] == [
        {"summary": "eval/s1/summary.json"},
        {"summary": "eval/s2/summary.json"},
    ]
    assert json.loads((tmp_path / "out" / "eval" / "s2" / "summary.json").read_text()) == {"stage": "s2"}


def test_resume_reruns_an_evaluation_that_failed(tmp_path: Path):
    """A stage is done before its evaluation; a failed evaluation must not be skipped forever on resume."""
    path = write_curriculum(tmp_path, "seq", SEQUENTIAL[:2])
    evaluated: list[str] = []

    def failing_on_s1(stage, entry, out):
        evaluated.append(stage)
        if stage == "s1":
            raise CurriculumFailed("evaluation of s1 failed")

    with pytest.raises(CurriculumFailed, match="evaluation of s1"):
        run_curriculum(path, runner=FakeRunner(), evaluator=failing_on_s1)
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert data["stages"][0]["status"] == DONE and "eval_note" not in data["stages"][0]

    runner = FakeRunner()
    run_curriculum(path, runner=runner, evaluator=lambda stage, *_: evaluated.append(stage))
    assert [name for name, _ in runner.calls] == ["s2"]  # s1 is not trained again, only evaluated
    assert evaluated == ["s1", "s1", "s2"]
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert [s["eval_note"] for s in data["stages"]] == ["no evaluation.command"] * 2
    run_curriculum(path, runner=FakeRunner(), evaluator=lambda stage, *_: evaluated.append(stage))
    assert evaluated == ["s1", "s1", "s2"]  # evaluated stages are not evaluated again


def test_a_stage_on_the_local_backend_gets_the_local_profile(tmp_path: Path):
    """As with launch/stage.sh: not the paper's cluster settings (and services) on a CPU machine."""
    path = write_curriculum(tmp_path, "seq", [f"{{name: s2, recipe: {RECIPES}/stage2_search.yaml, start: recipe}}"])
    config = path.read_text().replace(
        f"overrides: ['paths.root={tmp_path}']", f"overrides: ['paths.root={tmp_path}', backend=local]"
    )
    path.write_text(config)
    runner = FakeRunner()
    run_curriculum(path, runner=runner, evaluator=lambda *_: None)
    (recipe,) = runner.recipes
    profile = yaml.safe_load((RECIPES / "profile" / "local.yaml").read_text())
    env_local = yaml.safe_load((RECIPES / "env" / "local" / "search.yaml").read_text())  # the profile, then the env's
    assert recipe.cluster.name == "local" and recipe.rollout.num_rollout == env_local["rollout"]["num_rollout"]
    assert recipe.rollout.n_samples_per_prompt == profile["rollout"]["n_samples_per_prompt"]
    search = recipe.env_config["search"]
    assert search["retriever_url"] is None  # no retriever to start
    assert (search["protocol"], search["reward"]) == ("search_r1", "em")  # the protocol its gold demos are in
    assert recipe.run_dir == str(tmp_path / "out" / "runs" / "s2")


def test_a_broken_later_stage_fails_before_anything_runs(tmp_path: Path):
    stages = [SEQUENTIAL[0], f"{{name: s2, recipe: {RECIPES}/stage2_search.yaml, overrides: ['algorithm.lr_typo=1']}}"]
    runner = FakeRunner()
    with pytest.raises(RecipeError, match="lr_typo"):
        run_curriculum(write_curriculum(tmp_path, "seq", stages), runner=runner, evaluator=lambda *_: None)
    assert runner.calls == []


def test_start_must_name_an_earlier_stage(tmp_path: Path):
    stages = [SEQUENTIAL[0], f"{{name: s2, recipe: {RECIPES}/stage2_search.yaml, start: later}}"]
    with pytest.raises(RecipeError, match="later"):
        run_curriculum(write_curriculum(tmp_path, "seq", stages), runner=FakeRunner(), evaluator=lambda *_: None)


@pytest.mark.parametrize("path", sorted((RECIPES / "curriculum").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_curricula_compose_every_stage(path: Path, tmp_path: Path):
    import yaml

    from aclarena_slime.arena.runner import is_arena, load_arena, method_curriculum
    from aclarena_slime.curriculum.config import load_curriculum, recipe_path
    from aclarena_slime.curriculum.runner import stage_recipe

    files = [path]
    if is_arena(path):  # an arena: every method's curriculum, as the arena writes it
        arena = load_arena(path, [f"output_dir={tmp_path}"])
        files = []
        for name in arena.methods:
            files.append(tmp_path / f"{name}.yaml")
            files[-1].write_text(yaml.safe_dump(method_curriculum(arena, name, tmp_path / "base")[0]))
    for file in files:
        config = load_curriculum(file, [f"output_dir={tmp_path}"])
        for entry in config.stages:
            assert recipe_path(file, entry).is_file()
            recipe = stage_recipe(config, file, entry, None)
            assert recipe.name == entry.name


SMOKE_STAGES = ["smoke_math", "smoke_search_sft", "smoke_search", "smoke_retail_sft", "smoke_retail", "smoke_if"]


def _run_local_smoke(out: Path, first: int, extra: list[str]) -> tuple[Path, list[str], list[dict]]:
    """The local smoke curriculum's first ``first`` stages, for real (tiny model, real rollout functions); the
    curriculum's path, settings and manifest stages."""
    path = RECIPES / "curriculum" / "local_smoke.yaml"
    data = yaml.safe_load(path.read_text())
    smoke = data["overrides"]  # the curriculum's own (small batches), plus the test's
    spec = StagesFrom(**data["stages_from"])  # the stages its domain list makes, cut to the first ``first``
    stages = json.dumps(plan_stages(spec, path.parent)[:first])
    settings = [f"output_dir={out}", f"overrides=[{','.join([*smoke, *extra])}]", "stages_from=null", f"stages={stages}"]
    run_curriculum(path, settings)
    stages = json.loads((out / MANIFEST_NAME).read_text())["stages"]
    assert [s["name"] for s in stages] == SMOKE_STAGES[:first]
    assert all(s["backend"] == "local" and s["status"] == DONE for s in stages)
    for before, after in zip(stages, stages[1:], strict=False):  # each stage starts from the one before
        assert after["loaded"] == before["adapter"] and Path(after["adapter"], "adapter_config.json").exists()
    return path, settings, stages


@pytest.mark.slow
def test_local_smoke_curriculum_keeps_its_lineage_warm_starts_and_resumes(tmp_path: Path):
    """The authors' chain's first three stages on the local backend: math, search's SFT warm start on filtered
    teacher rollouts, search; each stage starts from the one before; every domain is evaluated after each; a
    rerun resumes as a no-op."""
    from aclarena_slime.curriculum.runner import default_stage_runner

    out = tmp_path / "smoke"
    path, settings, stages = _run_local_smoke(out, 3, [])
    metrics = json.loads(Path(stages[1]["adapter"]).with_name("metrics.json").read_text())
    assert metrics["kind"] == "sft" and metrics["kept"] >= 1 and metrics["steps"]
    assert json.loads((out / "experts.json").read_text())["experts"]["math"]["path"] == "runs/smoke_math/local/adapter"
    # every domain evaluated after every stage, through the math expert: the forgetting matrix's input
    for stage in stages:
        summary = json.loads((out / stage["eval"]["summary"]).read_text())
        assert summary["stage"] == stage["name"] and set(summary["domains"]) == {"math", "ifeval"}
    lines = (out / "eval" / "smoke_math" / "samples" / "math.jsonl").read_text().splitlines()
    assert {json.loads(line)["lora_path"] for line in lines} == {"math"}
    calls = []
    run_curriculum(path, settings, runner=lambda r: calls.append(r) or default_stage_runner(r))
    assert calls == []


@pytest.mark.chain
def test_local_smoke_curriculum_runs_the_whole_chain_through_retail(tmp_path: Path):
    """The whole chain, τ³-Retail's SFT warm start and RL stage and IFEval after it, for real."""
    tau3 = RECIPES.parents[1] / "shared" / "data" / "tau3-retail"
    if not tau3.is_dir():
        pytest.skip(f"τ³-Retail data not found at {tau3}")
    _, _, stages = _run_local_smoke(tmp_path / "smoke", len(SMOKE_STAGES), [f"++env_config.retail.data_dir={tau3}"])
    metrics = json.loads(Path(stages[3]["adapter"]).with_name("metrics.json").read_text())
    assert metrics["kind"] == "sft" and metrics["kept"] >= 1 and metrics["steps"]


def test_a_crashed_lora_stage_resumes_its_adapter_checkpoint(tmp_path: Path):
    """The rerun compiles the same checkpoint.save, where slime's patched load finds the adapter checkpoint."""
    from aclarena_slime.lora.checkpoint import adapter_checkpoint_root

    class SavesThenCrashes(FakeRunner):
        def __call__(self, recipe):
            if recipe.name != "e_math":
                return super().__call__(recipe)
            self.calls.append((recipe.name, recipe.checkpoint.load))
            self.recipes.append(recipe)
            if len(self.calls) == 2:  # first attempt: an adapter checkpoint at iteration 3, then the node dies
                root = adapter_checkpoint_root(recipe.checkpoint.save)
                (root / "iter_0000003").mkdir(parents=True)
                (root / "latest").write_text("3\n")
                raise KeyboardInterrupt("simulated crash")
            adapter = Path(recipe.checkpoint.save) / "adapters" / "math"
            adapter.mkdir(parents=True)
            return StageResult(0, "fake", checkpoint=recipe.checkpoint.save, adapter=str(adapter))

    stages = [
        f"{{name: backbone, recipe: {RECIPES}/sdft_backbone.yaml}}",
        f"{{name: e_math, recipe: {RECIPES}/mle_math.yaml, start: backbone, expert: math}}",
    ]
    path = write_curriculum(tmp_path, "mle", stages)
    runner = SavesThenCrashes()
    with pytest.raises(KeyboardInterrupt):
        run_curriculum(path, runner=runner, evaluator=lambda *_: None)
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert data["stages"][1]["resumed_adapter_iteration"] is None
    run_curriculum(path, runner=runner, evaluator=lambda *_: None)
    first, second = runner.recipes[1:]
    assert second.checkpoint.save == first.checkpoint.save
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert data["stages"][1]["status"] == DONE and data["stages"][1]["resumed_adapter_iteration"] == 3


def _with_monitor(path: Path, suite: str | None, backend: str) -> Path:
    text = path.read_text().replace(f"'paths.root={path.parent}'", f"'paths.root={path.parent}', backend={backend}")
    monitor = "{enabled: true, interval: 5, max_drop: 3.0" + (f", suite: {suite}" if suite else "") + "}"
    path.write_text(text + f"monitor: {monitor}\n")
    return path


def test_the_monitor_watches_the_earlier_domains_of_a_local_stage(tmp_path: Path):
    path = _with_monitor(write_curriculum(tmp_path, "seq", SEQUENTIAL[:3]), None, "local")
    runner = FakeRunner()
    run_curriculum(path, runner=runner, evaluator=lambda *_: None)
    monitors = [r.monitor for r in runner.recipes]
    assert not monitors[0].active  # nothing trained before the first stage
    assert monitors[1].domains == ["math"] and monitors[2].domains == ["math", "search"]
    assert monitors[2].interval == 5 and monitors[2].max_drop == 3.0
    # the local backend runs the recipe's section
    from aclarena_slime.local.session import open_session

    assert open_session(runner.recipes[2]).monitor["domains"] == ["math", "search"]
    assert open_session(runner.recipes[0]).monitor == {}


def test_on_slime_the_earlier_domains_join_the_stages_eval_config_and_the_alarm_hook(tmp_path: Path):
    from aclarena_slime.recipes.compiler import compile_recipe
    from aclarena_slime.slime_edge import path as hook_path

    (tmp_path / "watch.yaml").write_text(
        "name: watch\ndatasets:\n  gsm: {env: math, path: /data/math/gsm.jsonl, limit: 50}\n"
        "  nq: {env: search, path: /data/search/nq.jsonl}\n"
    )
    path = _with_monitor(write_curriculum(tmp_path, "seq", SEQUENTIAL[:2]), "watch.yaml", "slime")
    runner = FakeRunner()
    run_curriculum(path, runner=runner, evaluator=lambda *_: None)
    first, second = runner.recipes
    assert compile_recipe(first).eval_config is None and not first.monitor.active
    command = compile_recipe(second)
    names = [d["name"] for d in command.eval_config["eval"]["datasets"]]
    assert names == ["nq_test", "gsm"]  # the stage's own eval set stays; only the earlier domain joins
    assert command.eval_config["eval"]["datasets"][1]["path"] == "/data/math/gsm.jsonl@[0:50]"
    assert command.eval_config["eval"]["datasets"][1]["metadata_overrides"] == {"env": "math"}
    argv = command.train_args
    assert argv[argv.index("--eval-interval") + 1] == "5" and "--eval-prompt-data" not in argv
    assert argv[argv.index("--custom-eval-rollout-log-function-path") + 1] == hook_path("monitor_eval_log")
    section = command.custom_config["aclarena_monitor"]
    assert section["datasets"] == {"gsm": "math"} and section["domains"] == ["math"] and section["max_drop"] == 3.0
    assert section["out_dir"] == f"{second.run_dir}/monitor"
    command.write_custom_config()  # the eval config lands where --eval-config points
    assert Path(argv[argv.index("--eval-config") + 1]).is_file()


def test_a_bad_monitor_setting_is_a_recipe_error(tmp_path: Path):
    path = write_curriculum(tmp_path, "seq", SEQUENTIAL[:1])
    path.write_text(path.read_text() + "monitor: {enabled: true, action: panic}\n")
    with pytest.raises(RecipeError, match="monitor.action"):
        run_curriculum(path, runner=FakeRunner(), evaluator=lambda *_: None)


def should_run_periodic_action(rollout_id, interval, num_rollout_per_epoch=None, num_rollout=None):
    """slime.utils.misc.should_run_periodic_action at 624b824, line for line (train.py saves when it is true)."""
    if interval is None:
        return False
    if num_rollout is not None and rollout_id == num_rollout - 1:
        return True
    step = rollout_id + 1
    return (step % interval == 0) or (num_rollout_per_epoch is not None and step % num_rollout_per_epoch == 0)


def test_mle_experts_load_an_iteration_the_backbone_writes(tmp_path: Path):
    """slime saves iteration = rollout id when should_run_periodic_action says so: with save_interval 500 the SDFT
    stage writes iter_0000499, iter_0000999, ... and never iter_0000500 / iter_0001000."""
    path = Path(__file__).resolve().parents[2] / "recipes" / "curriculum" / "mle.yaml"
    config = load_curriculum(path, [f"output_dir={tmp_path}"])
    recipes = {e.name: stage_recipe(config, path, e, None) for e in config.stages}
    interval = recipes["sdft_backbone"].checkpoint.save_interval
    written = {i for i in range(3000) if should_run_periodic_action(i, interval)}  # the epoch-end save aside
    steps = {name: r.checkpoint.ckpt_step for name, r in recipes.items() if r.checkpoint.ckpt_step is not None}
    assert steps and all(step in written for step in steps.values()), steps
    assert all(saves_iteration(i, interval) == should_run_periodic_action(i, interval) for i in range(3000))


def test_a_curriculum_naming_an_iteration_never_written_is_refused(tmp_path: Path):
    stages = [
        f"{{name: backbone, recipe: {RECIPES}/sdft_backbone.yaml}}",
        f"{{name: e_math, recipe: {RECIPES}/mle_math.yaml, start: backbone, expert: math, overrides: [checkpoint.ckpt_step=1000]}}",
    ]
    runner = FakeRunner()
    with pytest.raises(RecipeError, match="iter_0001000, which backbone never writes.*499, 999"):
        run_curriculum(write_curriculum(tmp_path, "mle", stages), runner=runner, evaluator=lambda *_: None)
    assert runner.calls == []


def test_the_curriculum_writes_experts_json_through_the_expert_table(tmp_path: Path):
    """One writer: what the curriculum writes is what readers accept, so a bad adapter fails at write time."""
    from aclarena_slime.curriculum.manifest import Manifest
    from aclarena_slime.experts import ExpertError, ExpertTable

    manifest = Manifest.open(tmp_path, "c")
    manifest.set_expert("math", "runs/math/adapter", "stage1_math", None)
    table = ExpertTable.load(tmp_path / "experts.json")
    assert table.lookup("math").path == (tmp_path / "runs/math/adapter").resolve() and table.base_name == "c"
    with pytest.raises(ExpertError, match="outside the experts' directory"):
        manifest.set_expert("search", str(tmp_path.parent / "elsewhere"), "stage2_search", None)


def test_the_ray_head_serves_the_stages_the_runner_puts_on_slime(tmp_path: Path, monkeypatch):
    """One predicate: the head is held for the stages ``default_stage_runner`` sends to slime, whatever their
    cluster profile is called (``cluster=local backend=slime`` on a slime machine runs on slime)."""
    from aclarena_slime.curriculum.runner import slime_recipes
    from aclarena_slime.launcher import backend
    from aclarena_slime.recipes.compose import load_recipe

    monkeypatch.setattr(backend, "slime_available", lambda: True)
    monkeypatch.setattr(backend, "gpu_count", lambda: 8)
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "stage1_math.yaml"
    paper, local, forced = (
        load_recipe(recipe, [f"paths.root={tmp_path}", *extra])
        for extra in ([], ["cluster=local"], ["cluster=local", "cluster.backend=slime"])
    )
    on_slime = [id(r) for r in (paper, local, forced) if backend.choose_backend(r.cluster.backend).name == "slime"]
    assert [id(r) for r in slime_recipes([paper, local, forced])] == on_slime == [id(paper), id(forced)]


# Faults of a curriculum run (issue 44): a crash between a stage's end and its expert, an expert outside the run
# folder, an evaluation cut short, two runs into one folder, a curriculum killed while its evaluation runs.

MLE = [
    f"{{name: backbone, recipe: {RECIPES}/sdft_backbone.yaml}}",
    f"{{name: e_math, recipe: {RECIPES}/mle_math.yaml, start: backbone, expert: math}}",
]


def _experts(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "experts.json").read_text())["experts"]


@pytest.mark.slow
def test_a_done_stage_whose_expert_was_never_registered_is_repaired_not_skipped(tmp_path: Path):
    """The state a crash right after ``status=done`` left: the stage done, its expert nowhere. Evaluated as it
    was, the expert's column would be the base model's."""
    path = write_curriculum(tmp_path, "mle", MLE)
    run_curriculum(path, runner=FakeRunner(), evaluator=lambda *_: None)
    manifest = tmp_path / "out" / MANIFEST_NAME
    data = json.loads(manifest.read_text())
    data["experts"] = {}
    del data["stages"][1]["eval_note"]
    manifest.write_text(json.dumps(data))
    (tmp_path / "out" / "experts.json").unlink()

    again, seen = FakeRunner(), []
    run_curriculum(path, runner=again, evaluator=lambda stage, entry, out: seen.append((stage, entry["experts"])))
    assert again.calls == []  # nothing trained again
    assert _experts(tmp_path)["math"] == {"adapter": "math", "path": "runs/e_math/checkpoint/adapter", "stage": "e_math"}
    assert seen == [("e_math", str(tmp_path / "out" / "experts.json"))]  # evaluated with its expert


@pytest.mark.slow
def test_a_crash_while_the_expert_is_written_loses_nothing(tmp_path: Path, monkeypatch):
    path = write_curriculum(tmp_path, "mle", MLE)
    real = Manifest.write_experts

    def crash(self):
        raise KeyboardInterrupt("killed while writing experts.json")

    monkeypatch.setattr(Manifest, "write_experts", crash)
    with pytest.raises(KeyboardInterrupt):
        run_curriculum(path, runner=FakeRunner(), evaluator=lambda *_: None)
    monkeypatch.setattr(Manifest, "write_experts", real)
    again = FakeRunner()
    run_curriculum(path, runner=again, evaluator=lambda *_: None)
    assert again.calls == [] and _experts(tmp_path)["math"]["stage"] == "e_math"


def test_a_stage_without_its_adapter_is_failed_not_done(tmp_path: Path):
    class NoAdapter(FakeRunner):
        def __call__(self, recipe):
            result = super().__call__(recipe)
            result.adapter = None
            return result

    with pytest.raises(CurriculumFailed, match="produced no adapter"):
        run_curriculum(write_curriculum(tmp_path, "mle", MLE), runner=NoAdapter(), evaluator=lambda *_: None)
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert [s["status"] for s in data["stages"]] == [DONE, "failed"]


def test_an_expert_outside_the_output_dir_is_refused_before_anything_trains(tmp_path: Path):
    stages = [MLE[0], MLE[1].replace("expert: math}", f"expert: math, overrides: ['paths.runs={tmp_path}/shared']}}")]
    runner = FakeRunner()
    with pytest.raises(CurriculumFailed, match="e_math would write its expert's adapter .* outside"):
        run_curriculum(write_curriculum(tmp_path, "mle", stages), runner=runner, evaluator=lambda *_: None)
    assert runner.calls == []


def test_on_slime_a_sync_dir_outside_the_output_dir_is_refused_up_front(tmp_path: Path, monkeypatch):
    """The docs ask for lora.sync_dir on a shared filesystem: outside output_dir, experts.json cannot name it."""
    from aclarena_slime.launcher.backend import BackendChoice

    monkeypatch.setattr(curriculum_runner, "choose_backend", lambda _: BackendChoice("slime", "test"))
    stages = [MLE[0], MLE[1].replace("expert: math}", "expert: math, overrides: [lora.sync_dir=/shared/adapters]}")]
    runner = FakeRunner()
    with pytest.raises(CurriculumFailed, match="/shared/adapters/math"):
        run_curriculum(write_curriculum(tmp_path, "mle", stages), runner=runner, evaluator=lambda *_: None,
                       head=lambda _: pytest.fail("no head before the check"))  # fmt: skip
    assert runner.calls == []


def test_a_second_run_into_the_same_folders_is_refused_naming_the_first(tmp_path: Path):
    path = write_curriculum(tmp_path, "mle", MLE[:1])
    second: list[BaseException] = []

    class StartsASecondRun(FakeRunner):
        def __call__(self, recipe):
            try:
                run_curriculum(path, runner=FakeRunner(), evaluator=lambda *_: None)
            except BaseException as exc:  # noqa: BLE001 - what the second run says
                second.append(exc)
            return super().__call__(recipe)

    run_curriculum(path, runner=StartsASecondRun(), evaluator=lambda *_: None)
    assert len(second) == 1 and isinstance(second[0], CurriculumFailed)
    assert f"pid {os.getpid()}" in str(second[0]) and "in use by another run" in str(second[0])
    assert run_curriculum(path, runner=FakeRunner(), evaluator=lambda *_: None).is_done("backbone")  # released


EVAL = """
import json, pathlib, sys
out = pathlib.Path(sys.argv[1]); samples = out / "samples"
(out / "argv.txt").open("a").write(" ".join(sys.argv[2:]) + "\\n")
if (samples / "d.jsonl").exists() and "--resume" not in sys.argv:
    sys.exit("ResultsExist: already holds results; resume them or choose another output folder")
samples.mkdir(parents=True, exist_ok=True)
with (samples / "d.jsonl").open("a") as f:
    f.write("{}\\n")
if len((samples / "d.jsonl").read_text().splitlines()) == 1:
    sys.exit("killed mid-evaluation")
(out / "summary.json").write_text(json.dumps({"ok": True}))
"""


def test_an_evaluation_cut_short_resumes_on_the_rerun(tmp_path: Path):
    script = tmp_path / "eval.py"
    script.write_text(EVAL)
    path = write_curriculum(tmp_path, "mle", MLE[:1], evaluation=[sys.executable, str(script), "{out}"])
    with pytest.raises(CurriculumFailed, match="evaluation of backbone failed"):
        run_curriculum(path, runner=FakeRunner())
    run_curriculum(path, runner=FakeRunner())
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert data["stages"][0]["eval"] == {"summary": "eval/backbone/summary.json"}
    assert (tmp_path / "out" / "eval" / "backbone" / "argv.txt").read_text().splitlines() == ["", "--resume"]


EVAL_WITH_ENGINE = """
import os, pathlib, subprocess, sys, time
engine = subprocess.Popen(["sleep", "60"])
pathlib.Path(sys.argv[1], "pids").write_text(f"{os.getpid()} {engine.pid}")
time.sleep(60)
"""
CURRICULUM = """
import sys
from pathlib import Path
from aclarena_slime.curriculum.runner import command_evaluator, exit_on_signals
exit_on_signals()
command_evaluator([sys.executable, sys.argv[2], "{out}"])("s1", {}, Path(sys.argv[1]))
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_dead(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_curriculum_that_dies_takes_its_evaluation_with_it(tmp_path: Path, how):
    out = tmp_path / "eval"
    out.mkdir()
    script, evaluation = tmp_path / "curriculum.py", tmp_path / "evaluation.py"
    script.write_text(CURRICULUM)
    evaluation.write_text(EVAL_WITH_ENGINE)
    parent = subprocess.Popen([sys.executable, str(script), str(out), str(evaluation)])
    pids = out / "pids"
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.05)
    child, grandchild = (int(p) for p in pids.read_text().split())
    try:
        parent.send_signal(how)
        parent.wait(timeout=30)
        assert _wait_dead(child), "the evaluation outlived the curriculum"
        if how == signal.SIGTERM:  # its process group: the engine it started goes too
            assert _wait_dead(grandchild), "the evaluation's engine outlived the curriculum"
    finally:
        for pid in (child, grandchild):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
