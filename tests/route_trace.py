"""Trace one stage's route: which of our modules it loads, which it enters, and how often it climbs.

``python tests/route_trace.py [--json] [--slime-dry-run] RECIPE [overrides...]`` runs ``launch/stage.sh``'s
``main`` in this interpreter under a profiler and prints three figures (issue 24 measured the route by them):

- loaded: our modules (``aclarena_slime``, ``aclarena_envs``) in ``sys.modules`` at the end;
- entered: our modules one of whose functions ran for the route (not at import: a function a module body
  calls while it is imported, like a decorator, does not count);
- climbs: call edges (caller module -> callee module, both ``aclarena_slime``) whose callee sits in a higher
  layer (``tests/test_import_graph.py``'s ``LAYERS``) than its nearest caller of ours: a callback handed down.

``--slime-dry-run`` forces the slime backend and ``--dry-run`` (the slime compile) for comparison. The figures
are pinned by ``tests/launcher/test_local_route.py``; the list of each is printed for a reader.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import threading
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_import_graph import layer_of  # noqa: E402  (the layer order lives beside the import-graph test)

OURS = ("aclarena_slime", "aclarena_envs")
IMPORTING = "<frozen importlib._bootstrap"


def module_of(frame: FrameType) -> str:
    return frame.f_globals.get("__name__", "")


def is_ours(module: str) -> bool:
    return module.split(".")[0] in OURS


class RouteTrace:
    """A profile hook (all threads) that records the modules entered and the upward call edges."""

    def __init__(self) -> None:
        self.entered: dict[str, set[str]] = {}  # module -> the functions of it that ran
        self.climbs: set[tuple[str, str]] = set()
        self._seen: set[tuple[object, object]] = set()  # (caller code, callee code) pairs already classified

    def __call__(self, frame: FrameType, event: str, _arg: object) -> None:
        if event != "call" or not frame.f_code.co_flags & inspect.CO_OPTIMIZED:  # functions only, no bodies
            return
        callee = module_of(frame)
        if not is_ours(callee):
            return
        caller_frame = frame.f_back
        while caller_frame is not None and not is_ours(module_of(caller_frame)):
            if caller_frame.f_code.co_filename.startswith(IMPORTING):
                return  # run while a module is imported: not the route's work
            caller_frame = caller_frame.f_back
        pair = (caller_frame.f_code if caller_frame else None, frame.f_code)
        if pair in self._seen:
            return
        outer = caller_frame
        while outer is not None:
            if outer.f_code.co_filename.startswith(IMPORTING):
                return
            outer = outer.f_back
        self._seen.add(pair)
        self.entered.setdefault(callee, set()).add(frame.f_code.co_qualname)
        if caller_frame is None:
            return
        caller = module_of(caller_frame)
        if caller.startswith("aclarena_slime") and callee.startswith("aclarena_slime"):
            if layer_of(callee) > layer_of(caller):
                self.climbs.add((caller, callee))

    def run(self, argv: list[str]) -> int:
        from aclarena_slime.launcher.stage import main

        threading.setprofile(self)
        sys.setprofile(self)
        try:
            return main(argv)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]


def figures(trace: RouteTrace, rc: int) -> dict[str, object]:
    loaded = sorted(m for m in sys.modules if is_ours(m))
    return {
        "rc": rc,
        "loaded": loaded,
        "entered": {m: sorted(f) for m, f in sorted(trace.entered.items())},
        "climbs": sorted(f"{a} -> {b}" for a, b in trace.climbs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object on the last line")
    parser.add_argument("--slime-dry-run", action="store_true", help="the slime compile: backend=slime --dry-run")
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    stage_argv = [args.recipe, *args.overrides]
    if args.slime_dry_run:
        from aclarena_slime.launcher import backend

        backend.slime_available = lambda: True  # compile as on a slime machine; nothing is started
        stage_argv += ["backend=slime", "--dry-run"]
    trace = RouteTrace()
    out = figures(trace, trace.run(stage_argv))
    if args.json:
        print(json.dumps(out))
    else:
        for key in ("loaded", "entered", "climbs"):
            print(f"{key}: {len(out[key])}")
            for item in out[key]:
                detail = out[key][item] if isinstance(out[key], dict) else []
                print(f"  {item}" + (f": {', '.join(detail)}" if detail else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
