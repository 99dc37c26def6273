"""The doctor on a two-node stage: the save folder must be one shared folder and every input must be on
every node (issue 44, section 3). Two nodes are simulated through the doctor's node probe: node B sees
its own disk, a different folder, under the same paths as the head."""

from __future__ import annotations

import shutil
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aclarena_slime.launcher.preflight import failed
from aclarena_slime.launcher.preflight_cluster import cluster_checks, stage_inputs
from aclarena_slime.recipes.compose import load_recipe

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class _Pin:  # ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy, as the doctor builds it
    node_id: str
    soft: bool


class TwoNodes:
    """The slice of Ray the doctor uses: two alive nodes; a task pinned to node B runs with every path under
    ``root`` read from ``b_root`` instead (its own disk, mounted at the same path)."""

    def __init__(self, root: Path, b_root: Path) -> None:
        self.root, self.b_root = str(root), str(b_root)

    def nodes(self) -> list[dict[str, Any]]:
        node = {"Alive": True, "Resources": {"GPU": 8.0}}
        return [{**node, "NodeID": "a", "NodeManagerAddress": "10.0.0.1"},
                {**node, "NodeID": "b", "NodeManagerAddress": "10.0.0.2"}]  # fmt: skip

    def remote(self, **_: Any):
        return lambda fn: _Task(self, fn)

    def get(self, ref: Any, timeout: float) -> Any:
        return ref

    def on_b(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith(self.root):
            return self.b_root + value[len(self.root) :]
        if isinstance(value, list):
            return [self.on_b(v) for v in value]
        return value

    def back(self, value: Any) -> Any:
        """Node B's answer in the head's paths (a probe keys its answers by the paths it was given)."""
        if isinstance(value, dict):
            return {k.replace(self.b_root, self.root, 1): v for k, v in value.items()}
        return value


@dataclass
class _Task:
    ray: TwoNodes
    fn: Any
    pin: _Pin | None = None

    def options(self, scheduling_strategy: _Pin) -> _Task:
        return _Task(self.ray, self.fn, scheduling_strategy)

    def remote(self, *args: Any) -> Any:
        if self.pin is not None and self.pin.node_id == "b":
            return self.ray.back(self.fn(*(self.ray.on_b(a) for a in args)))
        return self.fn(*args)


@pytest.fixture
def pinning(monkeypatch):
    module = types.ModuleType("ray.util.scheduling_strategies")
    module.NodeAffinitySchedulingStrategy = _Pin
    monkeypatch.setitem(sys.modules, "ray.util.scheduling_strategies", module)


def _two_node_stage(root: Path, name: str = "mle_math"):
    recipe = load_recipe(REPO / f"recipes/{name}.yaml", [f"paths.root={root}", "cluster=paper_2x8"])
    for path in stage_inputs(recipe).values():  # the inputs exist on the head
        target = Path(path)
        if target.suffix == ".jsonl":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text('{"prompt": "1+1", "label": "2", "metadata": {"env": "math"}}\n')
        else:
            target.mkdir(parents=True, exist_ok=True)
            (target / "latest_checkpointed_iteration.txt").write_text("release")
    return recipe


def _checks(recipe, ray: TwoNodes) -> dict[str, Any]:
    checks = cluster_checks(recipe, {}, connect=lambda: ray, probe=lambda host, port: None)
    return {c.name: c for c in checks}


@pytest.mark.parametrize("name", ["sdft_backbone", "mle_math"])  # full fine-tuning had no shared-folder check at all
def test_a_two_node_stage_on_node_local_folders_is_refused(tmp_path, routable, pinning, name):
    root = tmp_path / "root"
    recipe = _two_node_stage(root, name)
    checks = _checks(recipe, TwoNodes(root, tmp_path / "node_b"))  # node B: an empty disk of its own
    assert failed(checks.values())
    save = checks["checkpoint.save"]
    assert save.status == "fail" and "10.0.0.2" in save.detail and "not shared" in save.detail
    assert "10.0.0.1" not in save.detail  # the head reads its own token
    for key in ("checkpoint.load", "model.hf_checkpoint", "data.prompt_data"):
        check = checks[f"input {key}"]
        assert check.status == "fail" and "10.0.0.2: missing" in check.detail, check


def test_copies_on_each_node_pass_the_inputs_but_not_the_save(tmp_path, routable, pinning):
    root = tmp_path / "root"
    recipe = _two_node_stage(root)
    shutil.copytree(root, tmp_path / "node_b" / "root")
    checks = _checks(recipe, TwoNodes(root, tmp_path / "node_b" / "root"))
    assert all(checks[f"input {key}"].status == "ok" for key in stage_inputs(recipe))
    assert checks["checkpoint.save"].status == "fail"
    (tmp_path / "node_b" / "root" / Path(recipe.data.prompt_data).relative_to(root)).write_text("{}\n")
    changed = _checks(recipe, TwoNodes(root, tmp_path / "node_b" / "root"))["input data.prompt_data"]
    assert changed.status == "fail" and "differs" in changed.detail


def test_a_shared_root_passes(tmp_path, routable, pinning):
    root = tmp_path / "root"
    recipe = _two_node_stage(root)
    checks = _checks(recipe, TwoNodes(root, root))
    for name in ("checkpoint.save", "lora sync_dir", *(f"input {k}" for k in stage_inputs(recipe))):
        assert checks[name].status == "ok", checks[name]
    assert "2 node(s)" in checks["checkpoint.save"].detail
