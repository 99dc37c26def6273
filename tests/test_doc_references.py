"""Every ``docs/`` page and ``benchmarks/`` script that a docstring, a recipe comment or a doc names exists.

A reader sent to a page that was renamed away (``docs/notes-engine.md``) learns nothing; a rename that
leaves a citation behind fails here, naming the file and line that cite it.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("aclarena_slime", "envs", "recipes", "launch", "benchmarks", "docs")
SUFFIXES = {".py", ".md", ".yaml", ".sh"}
CITED = re.compile(r"(?<![\w/.-])((?:docs|benchmarks)/[\w./-]+?\.(?:md|py|jsonl))(?![\w])")


def citations(text: str) -> list[tuple[int, str]]:
    """(line, path) of each ``docs/…`` or ``benchmarks/…`` path in ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in CITED.finditer(text)]


def test_every_cited_doc_page_and_benchmark_exists():
    files = [REPO / "README.md"] + [
        p for top in SCANNED for p in sorted((REPO / top).rglob("*")) if p.suffix in SUFFIXES and p.is_file()
    ]
    missing = [
        f"{path.relative_to(REPO)}:{line}: {cited}"
        for path in files
        for line, cited in citations(path.read_text(encoding="utf-8"))
        if not (REPO / cited).exists()
    ]
    assert not missing, "cited but not in the repository:\n  " + "\n  ".join(missing)


def test_the_reader_finds_a_citation_in_a_comment():
    text = "# batches every request (docs/notes-engine.md): one step\nsee benchmarks/bench_arena.py.\n"
    assert citations(text) == [(1, "docs/notes-engine.md"), (2, "benchmarks/bench_arena.py")]
