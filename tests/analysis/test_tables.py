"""Tables in Markdown, CSV and LaTeX, in the paper's layout, with reference numbers beside ours."""

from __future__ import annotations

import csv
import io

from aclarena_slime.analysis.sources import Curriculum, StageResult
from aclarena_slime.analysis.tables import Reference, load_reference, paper_table, to_csv, to_latex, to_markdown


def _curriculum():
    return Curriculum(
        stages=[
            StageResult("stage1_math", "math", {"math": 30.0, "search": 40.0}),
            StageResult("stage2_search", "search", {"math": 20.0, "search": 50.0}),
        ],
        base=StageResult("base", None, {"math": 10.0, "search": 20.0}),
    )


def _table(reference=None):
    oracles = {
        "math": StageResult("o1", "math", {"math": 35.0, "search": 1.0}),
        "search": StageResult("o2", "search", {"math": 2.0, "search": 55.0}),
    }
    methods = [("mle", "MLE", StageResult("mle", None, {"math": 33.0, "search": 52.5}))]
    return paper_table(_curriculum(), ["math", "search"], oracles, methods, reference)


REF = Reference({"seq:math": {"math": 25.83}, "mle": {"search": 49.7}}, {"math": "AIME26", "search": "NQ"}, "paper")


def test_markdown_layout_and_reference():
    assert to_markdown(_table(REF)) == (
        "| Method | AIME26 | NQ | Avg |\n"
        "|---|---|---|---|\n"
        "| **Base** | | | |\n"
        "| Base model | 10.00 | 20.00 | 15.00 |\n"
        "| **Sequential RL** | | | |\n"
        "| + math (stage1_math) | 30.00 (25.83) | 40.00 | 35.00 |\n"
        "| + search (stage2_search) | 20.00 | 50.00 | 35.00 |\n"
        "| **Oracles** | | | |\n"
        "| Oracle (one model per task) | 35.00 | 55.00 | 45.00 |\n"
        "| **MLE** | | | |\n"
        "| MLE | 33.00 | 52.50 (49.70) | 42.75 |\n"
        "\n"
        "In parentheses: the paper's number (paper).\n"
    )


def test_csv_has_paper_columns_only_where_the_reference_has_numbers():
    rows = list(csv.reader(io.StringIO(to_csv(_table(REF)))))
    assert rows[0] == ["group", "key", "method", "math", "search", "Avg", "math (paper)", "search (paper)"]
    assert rows[2] == ["Sequential RL", "seq:math", "+ math (stage1_math)", "30.0", "40.0", "35.0", "25.83", ""]
    assert rows[-1] == ["MLE", "mle", "MLE", "33.0", "52.5", "42.75", "", "49.7"]
    assert rows[0][-2:] == ["math (paper)", "search (paper)"]
    plain = list(csv.reader(io.StringIO(to_csv(_table()))))
    assert plain[0] == ["group", "key", "method", "math", "search", "Avg"]


def test_latex_is_a_booktabs_table_with_escaped_text():
    table = _table(REF)
    table.rows[1].label = "stage_1 & 100%"
    tex = to_latex(table, caption="Acc (%)")
    assert tex.startswith("\\begin{table}[t]\n\\centering\n\\caption{Acc (\\%)}\n\\begin{tabular}{lccc}\n\\toprule\n")
    assert "Method & AIME26 & NQ & Avg \\\\" in tex
    assert "\\multicolumn{4}{l}{\\textit{Sequential RL}} \\\\" in tex
    assert "stage\\_1 \\& 100\\% & 30.00 {\\scriptsize(25.83)} & 40.00 & 35.00 \\\\" in tex
    assert tex.count("\\midrule") == 1 + 3  # after the header, between the four groups
    assert tex.rstrip().endswith("\\end{table}")


def test_missing_value_shows_a_dash_and_no_average():
    curriculum = Curriculum([StageResult("s", "math", {"math": 1.0})])
    md = to_markdown(paper_table(curriculum, ["math", "search"]))
    assert "| + math (s) | 1.00 | – | – |" in md


def test_shipped_reference_holds_the_paper_numbers():
    ref = load_reference()
    assert [ref.rows[f"seq:{d}"]["math"] for d in ("math", "search", "retail", "ifeval")] == [25.83, 23.33, 6.04, 10.21]
    assert ref.rows["mle"] == {"math": 21.04, "search": 49.7, "single_hop": 57.7, "retail": 32.9, "ifeval": 85.0}
    assert ref.rows["oracle"] == {"search": 49.9, "single_hop": 56.0, "retail": 33.2}
    assert ref.rows["mopd"] == {"math": 21.25}
