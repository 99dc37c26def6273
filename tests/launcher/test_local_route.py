"""The local route (``bash launch/stage.sh recipes/stage2_search.yaml`` on a machine without slime) composes
its recipe once and loads only what the local backend needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aclarena_slime.launcher import backend, stage
from aclarena_slime.recipes import compose

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes" / "stage2_search.yaml")
# The route's own modules (aclarena_slime and the search plugin's) at the end of a run; 62 before the slime
# side's (the HF export, the lineage, the flag table) were left to slime runs. A new import on the route
# must earn its place: raise the bound in the same change, saying why. 62 since the one adapter swap
# (adapter_swap: versions, checksums) and the log-prob parity check before the first update (parity) joined
# the route, while the slime side's three left it.
MAX_MODULES = 62


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


@pytest.mark.slow  # one tiny stage in a fresh interpreter
def test_the_local_route_loads_few_of_our_modules(tmp_path: Path):
    script = f"""
import json, sys
from aclarena_slime.launcher.stage import main
rc = main([{RECIPE!r}, "paths.root={tmp_path}", "rollout.num_rollout=1", "rollout.rollout_batch_size=1",
           "rollout.n_samples_per_prompt=2", "rollout.rollout_max_response_len=16", "++cluster.local.eval_size=1",
           "++cluster.local.warm_start_steps=0", "++cluster.local.progress=false"])
print(json.dumps([rc, sorted(m for m in sys.modules if m.split(".")[0] in ("aclarena_slime", "aclarena_envs"))]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, check=False)
    rc, modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert rc == 0, done.stderr[-2000:]
    assert (tmp_path / "runs" / "stage2_search" / "local" / "metrics.json").is_file()
    assert not [
        m for m in modules if m.startswith(("aclarena_slime.launcher.hf_export", "aclarena_slime.recipes.flags"))
    ]
    assert len(modules) <= MAX_MODULES, modules
