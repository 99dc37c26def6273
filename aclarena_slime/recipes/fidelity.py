"""The fidelity table: every paper run, setting by setting, the authors' value beside ours.

The authors' values (with the script and line each comes from) live in one data file,
``recipes/fidelity/authors.yaml``; ours are read from the compiled recipe (the exact slime command and
custom config :func:`compile_recipe` produces). A row is *same* when the two agree, *equivalent* when ours
is the stated equivalent of theirs (a path in our layout, our plugin for theirs), and otherwise must
say why we differ. Regenerate ``recipes/FIDELITY.md`` with::

    python -m aclarena_slime.recipes.fidelity          # writes recipes/FIDELITY.md
    python -m aclarena_slime.recipes.fidelity --check  # exit 1 when a difference has no reason or the file is stale
    python -m aclarena_slime.recipes.fidelity --check --authors DIR  # and when a cited line lacks its flag

``--authors DIR`` is a checkout of WillDreamer/ACLArena: every ``FILE:LINES`` citation of a row must name a
file and lines that exist there, and the cited lines must hold the row's flag (its ``--flag`` key) or the text
its ``cites`` field names, so a citation that has shifted fails. A ``--flag`` key is looked for when the first
citation is a shell script; other rows without ``cites`` are checked for existence only.

Keys of a row name where our value is read: ``--flag`` (the compiled command line; a switch is ``true``,
a flag not passed is ``null``), ``custom.a.b`` (the custom config slime sets on ``args``),
``env.TAG.key`` (an env's settings), ``tis.key`` (the mismatch correction's settings when ``--use-tis``
is on, else ``null``; a LoRA stage's ``--use-tis`` that only carries the parity check reads as off), ``recipe.a.b`` (the composed recipe), ``eval.DATASET.key`` (a dataset of the
compiled ``--eval-config``), ``code.module:NAME`` (a constant of our code, for behaviour no setting
holds: a prompt text). A run with ``suite:`` instead of ``recipe:`` is an evaluation suite; its keys are
``suite.DATASET.field`` (``suite.aime26.env_config.prompt``). ``curriculum.NAME.STAGE.a.b`` reads a stage's
setting in ``recipes/curriculum/NAME.yaml`` (the SDFT mixture's filter: ``curriculum.sdft_data.sdft_backbone.distill``).

Only *same* counts as the authors' way: an *equivalent* row is a stand-in of ours for the same thing (a
path, a plugin), and a substitution that changes what is trained or measured is a difference with a
reason. The table opens with the counts.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from aclarena_slime.recipes.compiler import REPO_ROOT, SlimeCommand, compile_recipe
from aclarena_slime.recipes.compose import load_recipe
from aclarena_slime.recipes.domains import StagesFrom, plan_stages
from aclarena_slime.recipes.schema import StageRecipe
from aclarena_slime.slime_edge import path as hook_path

DATA = REPO_ROOT / "recipes" / "fidelity" / "authors.yaml"
TABLE = REPO_ROOT / "recipes" / "FIDELITY.md"
ROOT = "/ROOT"  # paths.root of the compiled recipes; shown as ${root}
ROW_FIELDS = {"setting", "key", "authors", "source", "reason", "equivalent", "cites"}
SHOWN_CHARS = 90  # a longer value of ours (a prompt text read from the code) is cut in the table


class FidelityError(ValueError):
    pass


@dataclass(frozen=True)
class Row:
    run: str
    setting: str
    key: str
    authors: Any
    source: str
    ours: Any
    status: str  # "same", "equivalent", "differs" or "unexplained"
    reason: str = ""


def load_data(path: Path = DATA) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, Mapping) or not isinstance(data.get("runs"), Mapping):
        raise FidelityError(f"{path}: expected a mapping with 'runs'")
    return dict(data)


def run_rows(data: Mapping[str, Any], run: str) -> list[dict[str, Any]]:
    """The rows of ``run``: those of the run it inherits, replaced key by key by its own, in order."""
    spec = data["runs"][run]
    rows: dict[str, dict[str, Any]] = {}
    if spec.get("inherits"):
        rows = {row["key"]: row for row in run_rows(data, spec["inherits"])}
    for row in spec.get("rows") or []:
        unknown = set(row) - ROW_FIELDS
        missing = {"setting", "key", "authors", "source"} - set(row)
        if unknown or missing:
            raise FidelityError(f"run {run}, row {row}: unknown fields {sorted(unknown)}, missing {sorted(missing)}")
        rows[row["key"]] = row
    return list(rows.values())


def suite_datasets(suite_file: str) -> dict[str, Any]:
    """The datasets of an eval suite under recipes/, by name (services left unset)."""
    from aclarena_slime.recipes.compiler import load_stage_suite

    return {d.name: d for d in load_stage_suite(REPO_ROOT / "recipes" / suite_file).datasets}


def suite_value(key: str, datasets: Mapping[str, Any]) -> Any:
    """Our value of a ``suite.DATASET.field[.key...]`` row."""
    head, _, rest = key.partition(".")
    name, _, dotted = rest.partition(".")
    if head != "suite" or name not in datasets or not dotted:
        raise FidelityError(f"key {key!r}: expected suite.DATASET.field with DATASET one of {sorted(datasets)}")
    field, _, inner = dotted.partition(".")
    value = getattr(datasets[name], field)
    return _dig(value, inner) if inner else value


def compiled(recipe_file: str) -> tuple[StageRecipe, SlimeCommand]:
    recipe = load_recipe(REPO_ROOT / "recipes" / recipe_file, [f"paths.root={ROOT}"])
    return recipe, compile_recipe(recipe)


def our_value(key: str, recipe: StageRecipe, command: SlimeCommand) -> Any:
    """Our value of a row's key, from the compiled command (see the module docstring)."""
    if key in _TIS_KEYS and _parity_only_tis(command):
        return None
    if key.startswith("--"):
        argv = command.train_args
        if key not in argv:
            return None
        values = []
        for arg in argv[argv.index(key) + 1 :]:
            if arg.startswith("--"):
                break
            values.append(arg)
        return True if not values else values[0] if len(values) == 1 else " ".join(values)
    head, _, rest = key.partition(".")
    if head == "custom":
        return _dig(command.custom_config, rest)
    if head == "env":
        return _dig(command.custom_config.get("aclarena_env_config") or {}, rest)
    if head == "tis":
        if "--use-tis" not in command.train_args or _parity_only_tis(command):
            return None
        from types import SimpleNamespace

        from aclarena_slime.slime_edge import custom  # what the TIS hook reads from slime's args

        return getattr(custom.tis(SimpleNamespace(**command.custom_config)), rest)
    if head == "eval":
        name, _, field = rest.partition(".")
        entries = {d["name"]: d for d in (command.eval_config or {}).get("eval", {}).get("datasets", [])}
        return entries.get(name, {}).get(field)
    if head == "code":
        from aclarena_slime.dotted import load_dotted

        return load_dotted(rest)
    if head == "curriculum":
        return curriculum_value(rest)
    if head == "recipe":
        value: Any = recipe
        for part in rest.split("."):
            value = value.get(part) if isinstance(value, Mapping) else getattr(value, part, None)
        return value
    raise FidelityError(f"key {key!r}: starts with --, custom., env., tis., recipe., eval., curriculum. or code.")


def curriculum_value(dotted: str) -> Any:
    """``NAME.STAGE.a.b``: a setting of stage STAGE in ``recipes/curriculum/NAME.yaml`` (e.g. its distill filter)."""
    name, _, rest = dotted.partition(".")
    stage, _, inner = rest.partition(".")
    path = REPO_ROOT / "recipes" / "curriculum" / f"{name}.yaml"
    if not path.is_file():
        raise FidelityError(f"key curriculum.{dotted!r}: no curriculum {path}")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    made = plan_stages(StagesFrom(**data["stages_from"]), path.parent) if data.get("stages_from") else []
    stages = {s.get("name"): s for s in data.get("stages") or made}  # listed, or made from the domain list
    if stage not in stages:
        raise FidelityError(f"key curriculum.{dotted!r}: {path.name} has no stage {stage!r}")
    return _dig(stages[stage], inner) if inner else stages[stage]


_TIS_KEYS = ("--use-tis", "--custom-tis-function-path")


def _parity_only_tis(command: SlimeCommand) -> bool:
    """``--use-tis`` that only reaches slime's TIS call for the parity check (``parity_in_loss``, which weights
    nothing): no mismatch correction, so the table reads TIS as off."""
    argv = command.train_args
    flag = "--custom-tis-function-path"
    return flag in argv and argv[argv.index(flag) + 1] == hook_path("parity_in_loss")


def _dig(mapping: Mapping[str, Any], dotted: str) -> Any:
    value: Any = mapping
    for part in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _show(value: Any, cut: bool = False) -> str:
    if value is None:
        return "—"
    if value is True:
        return "on"
    if value is False:
        return "off"
    if isinstance(value, list | tuple):
        return " ".join(_show(v) for v in value)
    text = str(value).replace(ROOT, "${root}")
    return text if not cut or len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def agree(ours: Any, theirs: Any) -> bool:
    """Switches as switches (on, or off/unset), numbers as numbers, anything else as its text."""
    if theirs is None or isinstance(theirs, bool):
        return ours is True if theirs else ours is None or ours is False
    if ours is None or isinstance(ours, bool):
        return False
    try:
        return float(ours) == float(theirs)
    except (TypeError, ValueError):
        return _show(ours) == _show(theirs)


def _reader(spec: Mapping[str, Any]) -> Callable[[str], Any]:
    """Our value of a key in one run: a compiled recipe, or an eval suite (``suite:``)."""
    if "suite" in spec:
        datasets = suite_datasets(spec["suite"])
        return lambda key: suite_value(key, datasets)
    recipe, command = compiled(spec["recipe"])
    return lambda key: our_value(key, recipe, command)


def table(data: Mapping[str, Any] | None = None) -> list[Row]:
    data = data if data is not None else load_data()
    out: list[Row] = []
    for run, spec in data["runs"].items():
        value = _reader(spec)
        for row in run_rows(data, run):
            ours = value(row["key"])
            if agree(ours, row["authors"]):
                status, why = "same", ""
            elif "equivalent" in row and agree(ours, row["equivalent"]):
                status, why = "equivalent", str(row.get("reason") or "")
            elif row.get("reason"):
                status, why = "differs", str(row["reason"])
            else:
                status, why = "unexplained", ""
            out.append(Row(run, row["setting"], row["key"], row["authors"], row["source"], ours, status, why))
    return out


def render(rows: list[Row], data: Mapping[str, Any] | None = None) -> str:
    data = data if data is not None else load_data()
    lines = [
        "# Fidelity: the authors' runs against ours, setting by setting",
        "",
        "Generated by `python -m aclarena_slime.recipes.fidelity` from `recipes/fidelity/authors.yaml` (the",
        "authors' values, each with its source in WillDreamer/ACLArena) and the compiled recipes (ours);",
        "`tests/recipes/test_fidelity.py` fails when a difference has no reason or this file is stale.",
        "Do not edit by hand. `${root}` is `paths.root`; — means not set.",
        "",
        counts(rows),
        "",
    ]
    for run, spec in data["runs"].items():
        lines += [f"## {run} — `recipes/{spec.get('recipe') or spec['suite']}`", ""]
        if spec.get("about"):
            lines += [str(spec["about"]).strip(), ""]
        lines += ["| setting | authors | source | ours | |", "|---|---|---|---|---|"]
        for row in (r for r in rows if r.run == run):
            verdict = {"same": "same", "unexplained": "**UNEXPLAINED**"}.get(row.status, row.reason or row.status)
            if row.status == "equivalent":
                verdict = "equivalent" + (f": {row.reason}" if row.reason else "")
            cells = [row.setting, f"`{_show(row.authors)}`", row.source, f"`{_show(row.ours, cut=True)}`", verdict]
            lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def counts(rows: list[Row]) -> str:
    """The table's totals: only *same* is the authors' way; *equivalent* is a stand-in for the same thing."""
    total = {
        status: sum(r.status == status for r in rows) for status in ("same", "equivalent", "differs", "unexplained")
    }
    return (
        f"**{len(rows)} rows over {len({r.run for r in rows})} runs: {total['same']} same, "
        f"{total['equivalent']} equivalent (our path or plugin for theirs), {total['differs']} differ "
        f"(each with its reason), {total['unexplained']} unexplained.**"
    )


_CITATION = re.compile(r"(?P<path>[\w./+-]+\.(?:sh|py|yaml|yml|md|json|txt)):(?P<lines>\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)")


def citations(source: str) -> list[tuple[str, list[int]]]:
    """The ``FILE:LINES`` citations of a row's source, lines expanded (``:42,72``, ``:49-50``)."""
    out = []
    for match in _CITATION.finditer(source):
        lines: list[int] = []
        for part in match["lines"].split(","):
            first, _, last = part.partition("-")
            lines.extend(range(int(first), int(last or first) + 1))
        out.append((match["path"], lines))
    return out


def _resolve(authors: Path, cited: str, near: Path | None) -> Path | None:
    """The cited file in the authors' checkout: from its root, from ``slime/examples/``, beside the row's previous
    citation, or the one file of that name."""
    for base in (authors, authors / "slime" / "examples", near):
        if base is not None and (base / cited).is_file():
            return base / cited
    named = [p for p in authors.rglob(f"*{Path(cited).name}") if p.is_file() and str(p).endswith(cited)]
    return named[0] if len(named) == 1 else None


def check_citations(authors: Path, data: Mapping[str, Any] | None = None) -> tuple[list[str], int]:
    """Problems with the table's citations against the authors' checkout, and how many rows had their flag or
    ``cites`` text looked for in the cited lines."""
    data = data if data is not None else load_data()
    problems, checked, texts = [], 0, {}
    for run, spec in data["runs"].items():
        for row in spec.get("rows") or []:
            cited = citations(str(row["source"]))
            script = bool(cited) and cited[0][0].endswith(".sh")  # a flag is looked for in a script's lines only
            needle = row.get("cites") or (row["key"] if script and str(row["key"]).startswith("--") else None)
            where = f"{run}: {row['setting']} ({row['source']})"
            held, near = [], None
            for name, lines in cited:
                path = _resolve(authors, name, near)
                if path is None:
                    problems.append(f"{where}: no file {name} in {authors}")
                    continue
                near = path.parent
                if path not in texts:
                    texts[path] = path.read_text(encoding="utf-8", errors="replace").splitlines()
                past = [n for n in lines if not 1 <= n <= len(texts[path])]
                if past:
                    problems.append(f"{where}: {name} has {len(texts[path])} lines, cited {past}")
                held += [texts[path][n - 1] for n in lines if 1 <= n <= len(texts[path])]
            if needle and held:
                checked += 1
                if not any(str(needle) in line for line in held):
                    problems.append(f"{where}: no cited line holds {needle!r}")
    return problems, checked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aclarena_slime.recipes.fidelity", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="write nothing; fail on unexplained rows or a stale table")
    parser.add_argument(
        "--authors", type=Path, help="with --check: a checkout of WillDreamer/ACLArena; fail when a citation has shifted"
    )
    args = parser.parse_args(argv)
    if args.authors is not None and not args.check:
        parser.error("--authors goes with --check")
    if args.authors is not None and not args.authors.is_dir():
        parser.error(f"--authors {args.authors}: not a folder")
    rows = table()
    text = render(rows)
    bad = [r for r in rows if r.status == "unexplained"]
    for row in bad:
        print(f"{row.run}: {row.setting} ({row.key}): authors {_show(row.authors)}, ours {_show(row.ours)}, "
              "and no reason", file=sys.stderr)  # fmt: skip
    if args.check:
        stale = not TABLE.is_file() or TABLE.read_text(encoding="utf-8") != text
        if stale:
            print(f"{TABLE} is stale: python -m aclarena_slime.recipes.fidelity", file=sys.stderr)
        shifted: list[str] = []
        if args.authors is not None:
            shifted, checked = check_citations(args.authors)
            for problem in shifted:
                print(problem, file=sys.stderr)
            print(f"citations: {checked} rows' flags found in their cited lines, {len(shifted)} problems", file=sys.stderr)
        return 1 if bad or stale or shifted else 0
    TABLE.write_text(text, encoding="utf-8")
    print(f"wrote {TABLE} ({len(rows)} rows, {len(bad)} unexplained)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
