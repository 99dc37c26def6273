"""The local route (``bash launch/stage.sh recipes/stage2_search.yaml`` on a machine without slime) composes
its recipe once and loads only what the local backend needs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from aclarena_slime.launcher import backend, stage
from aclarena_slime.plugin.settings import from_mapping
from aclarena_slime.recipes import compose
from aclarena_slime.recipes.local_section import LocalBackendSettings

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes" / "stage2_search.yaml")
# The route's own modules (aclarena_slime and the search plugin's) at the end of a run: warm start, GRPO,
# the held-out check. A new import on the route must earn its place: raise the bound in the same change,
# saying why. 62 until the search plugin loaded only what its search_r1 protocol uses (its tool-call
# protocol, E5 encoder and router prompts load with the runs that use them); 57 = 11 packages, 39 of the
# library's files and 7 of the plugin's. Of the library's 39, 33 run code here; the other 6 are the typed
# stage spec's sections (distill.mopd, distill.balanced_source, tis), the held-out seed (evaluation.suite)
# and the rollout's expert table and adapter versions (experts, adapter_swap). Halving it would mean merging
# modules that hold separate concerns. 58 since a GRPO step samples its groups through local.group_filter (one
# round without a filter; the recipe's dynamic sampling with one), which runs code: 34 of 40 library files.
# 59 since the agent loop recognises an engine's "adapter not served" answers through sglang_errors (SGLang's
# exact words in one place, shared with the gateway and the test doubles); it runs nothing on a healthy run.
# 61 since the demo-turns function loads through the library's one dotted-path loader (dotted, which replaced five
# copies) and the local stage's rollouts and evaluations left local.stage for local.rollouts (the stage runner
# grew one GRPO loop for one expert or N, and stays under 800 lines): 36 of 43 library files run code.
# 64: main's route had grown to 63 by then (its failing bound left as found), and one more since the local stage's
# settings are read once, by its builder (local.session), into the parts its phases take.
# 66 since the local stage's builder reads the recipe itself (issue 41): its torch-free settings (local.parts) let
# --dry-run build the session without loading torch, and the runner over one session or N experts (local.run) left
# local.spec, which the builder imports for its refusals (no import circle).
MAX_MODULES = 66
# The modules whose functions run for the stage (not at import): 36 of the library's, 7 of the plugin's; 46 once
# main's route had grown (see above) and the builder (local.session) runs too.
MAX_ENTERED = 48  # 48 with local.parts and local.run (see MAX_MODULES)
# Calls from a lower layer into a higher one (tests/test_import_graph.py's LAYERS), as caller -> callee
# modules. All three are handed down, never imported: the local profile (launcher.stage) that compose
# applies, the typed config class (local.config) that plugin.settings.from_mapping builds, and the gold demo
# policy (local.demos) that the agent loop drives.
MAX_CLIMBS = 3


def test_a_local_run_composes_its_recipe_once(tmp_path: Path, monkeypatch, capsys):
    typed = []
    original = compose.to_recipe
    monkeypatch.setattr(compose, "to_recipe", lambda *a, **k: typed.append(a) or original(*a, **k))
    monkeypatch.setattr(backend, "slime_available", lambda: False)  # the local backend runs it, as in CI
    monkeypatch.chdir(tmp_path)
    assert stage.main([RECIPE, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert len(typed) == 1  # one typed, validated recipe: the local profile joined the first composition
    assert "# local plan: env search" in out and f"{tmp_path}/runs/stage2_search/local" in out


@pytest.mark.slow  # one tiny stage in a fresh interpreter, traced (tests/route_trace.py)
def test_the_local_route_loads_and_enters_few_of_our_modules(tmp_path: Path):
    overrides = [f"paths.root={tmp_path}", "rollout.num_rollout=1", "rollout.rollout_batch_size=1",
                 "rollout.n_samples_per_prompt=2", "rollout.rollout_max_response_len=128", "++cluster.local.eval_size=1",
                 "++cluster.local.warm_start_steps=1", "++cluster.local.warm_start_records=8",
                 "++cluster.local.progress=false"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "route_trace.py"), "--json", RECIPE, *overrides],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    route = json.loads(done.stdout.strip().splitlines()[-1])
    assert route["rc"] == 0, done.stderr[-2000:]
    assert (tmp_path / "runs" / "stage2_search" / "local" / "metrics.json").is_file()
    loaded = route["loaded"]
    assert not [
        m for m in loaded if m.startswith(("aclarena_slime.launcher.hf_export", "aclarena_slime.recipes.flags"))
    ]
    assert len(loaded) <= MAX_MODULES, loaded
    assert len(route["entered"]) <= MAX_ENTERED, sorted(route["entered"])
    assert len(route["climbs"]) <= MAX_CLIMBS, route["climbs"]


def test_the_tracer_counts_a_call_handed_down_to_a_higher_layer_as_a_climb():
    """The measure itself: the generic settings reader (plugin, layer 1) building a recipe section's type
    (recipes, layer 6) enters both modules and climbs once."""
    spec = importlib.util.spec_from_file_location("route_trace", REPO / "tests" / "route_trace.py")
    assert spec is not None and spec.loader is not None
    route_trace = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(route_trace)
    trace = route_trace.RouteTrace()
    sys.setprofile(trace)
    try:
        from_mapping(LocalBackendSettings, {}, "cluster.local keys")
    finally:
        sys.setprofile(None)
    assert set(trace.entered) == {"aclarena_slime.plugin.settings", "aclarena_slime.recipes.local_section"}
    assert trace.climbs == {("aclarena_slime.plugin.settings", "aclarena_slime.recipes.local_section")}
