"""The fidelity table: every paper run compiled, every difference from the authors explained, FIDELITY.md current."""

from __future__ import annotations

import copy

import pytest

from aclarena_slime.recipes import fidelity
from aclarena_slime.recipes.fidelity import FidelityError, agree, load_data, render, run_rows, table


@pytest.fixture(scope="module")
def data():
    return load_data()


@pytest.fixture(scope="module")
def rows(data):
    return table(data)


def test_every_difference_from_the_authors_has_a_reason(rows):
    unexplained = [f"{r.run}: {r.setting} ({r.key}) authors {r.authors!r}, ours {r.ours!r}" for r in rows
                   if r.status == "unexplained"]  # fmt: skip
    assert not unexplained, "\n".join(unexplained)


def test_fidelity_md_is_generated_from_the_data_and_the_recipes(data, rows):
    assert fidelity.TABLE.read_text(encoding="utf-8") == render(rows, data), (
        "recipes/FIDELITY.md is stale: python -m aclarena_slime.recipes.fidelity"
    )


def test_every_paper_run_is_in_the_table(data):
    runs = {(spec.get("recipe") or spec["suite"]).removesuffix(".yaml") for spec in data["runs"].values()}
    paper = {"stage1_math", "stage2_search_sft", "stage2_search", "stage3_retail_sft", "stage3_retail", "stage4_if",
             "sdft_backbone", "mle_math", "mle_search", "mle_retail", "mle_if", "oracle_math", "oracle_search",
             "oracle_retail", "oracle_if", "mopd", "oracle_search_sft", "oracle_retail_sft", "teacher_search",
             "teacher_retail", "oracle_rollouts_math", "oracle_rollouts_search", "oracle_rollouts_retail",
             "oracle_rollouts_if", "eval/paper"}  # fmt: skip
    assert paper <= runs


def test_each_run_covers_the_settings_that_change_training(data):
    for run in data["runs"]:
        keys = {row["key"] for row in run_rows(data, run)}
        recipe = data["runs"][run].get("recipe")
        if recipe is None:  # the final evaluation: what each domain is scored by
            assert {"suite.aime26.env_config.grader", "suite.nq.env_config.reward", "suite.retail.env_config.shaping",
                    "suite.ifeval.env_config.thinking"} <= keys  # fmt: skip
        elif recipe.startswith(("teacher", "oracle_rollouts")):
            assert {"--debug-rollout-only", "--n-samples-per-prompt"} <= keys, run
        elif recipe.startswith(("stage", "mle", "oracle", "mopd")) and "sft" not in run:
            assert {"--load", "--lr", "--rollout-batch-size", "--n-samples-per-prompt", "--use-tis",
                    "--rollout-max-response-len", "--tensor-model-parallel-size"} <= keys, run  # fmt: skip
        else:
            assert {"--load", "--lr", "--global-batch-size", "--loss-type"} & keys, run
    mixture = {row["key"] for row in run_rows(data, "sdft_backbone")}
    assert {f"curriculum.sdft_data.sdft_backbone.distill.thresholds.{d}" for d in ("search", "retail", "math", "ifeval")} <= mixture


def test_the_sdft_mixture_filters_as_the_authors_where_they_released_a_filter(rows):
    """Search at reward >= 0.4 (filter_rollout_data.py), tau at 1.0 (parse_rollout_to_sft.py), no per-prompt cap."""
    mixture = {r.setting: r for r in rows if r.run == "sdft_backbone"}
    assert (mixture["search: reward threshold"].ours, mixture["tau: reward threshold"].ours) == (0.4, 1.0)
    assert mixture["per-prompt cap"].status == "same" and mixture["per-prompt cap"].ours is None
    retail = {r.setting: r.ours for r in rows if r.run == "oracle_rollouts_retail"}
    assert int(retail["rollouts"]) * int(retail["prompts per rollout"]) * int(retail["samples per prompt"]) == 19_200


def test_a_recipe_that_drifts_from_the_authors_fails_the_table(data):
    """Change the authors' learning rate of the math stage: the compiled 1e-6 no longer agrees, no reason given."""
    drifted = copy.deepcopy(data)
    row = next(r for r in drifted["runs"]["stage1_math"]["rows"] if r["key"] == "--lr")
    row["authors"] = 2.0e-6
    bad = [r for r in table({"runs": {"stage1_math": drifted["runs"]["stage1_math"]}}) if r.status == "unexplained"]
    assert [r.key for r in bad] == ["--lr"]


def test_an_equivalent_must_match_our_compiled_value(data):
    drifted = copy.deepcopy(data)
    row = next(r for r in drifted["runs"]["stage2_search"]["rows"] if r["key"] == "--custom-tis-function-path")
    row["equivalent"] = "somewhere.else"
    (checked,) = [r for r in table({"runs": {"stage2_search": drifted["runs"]["stage2_search"]}})
                  if r.key == "--custom-tis-function-path"]  # fmt: skip
    assert checked.status == "differs"  # a stated reason still stands, but the equivalence no longer holds


def test_substitutions_are_counted_as_differences(rows):
    """The teacher, the data format of the warm starts and τ³ for τ-bench v1 change what is trained: never
    'equivalent' (a stand-in for the same thing), always a difference with its reason."""
    substitutions = [r for r in rows if (r.run, r.setting) in {
        ("stage2_search_sft", "teacher"), ("stage3_retail_sft", "teacher"), ("stage2_search_sft", "data format"),
        ("stage3_retail_sft", "data format"), ("stage3_retail", "environment"), ("mle_retail", "starts from")}]  # fmt: skip
    assert len(substitutions) == 6 and {r.status for r in substitutions} == {"differs"}
    assert fidelity.counts(rows).startswith(f"**{len(rows)} rows")


def test_the_final_evaluation_and_the_mopd_eval_are_read_from_what_runs(rows):
    by_key = {(r.run, r.key): r for r in rows}
    assert by_key[("final_eval", "suite.aime26.env_config.grader")].status == "same"
    assert by_key[("final_eval", "suite.nq.env_config.reward")].status == "differs"
    math_eval = by_key[("mopd", "eval.math-aime2024.n_samples_per_eval_prompt")]
    assert (math_eval.ours, math_eval.status) == (4, "same")
    prompt = by_key[("stage3_retail", "code.aclarena_envs.retail.env:AGENT_INSTRUCTION")]
    assert prompt.ours.startswith("You are a customer service agent") and prompt.status == "differs"


def test_values_compare_as_switches_numbers_or_text():
    assert agree(True, True) and agree(None, False) and agree(None, None) and not agree(None, True)
    assert agree("1.0e-6", 1e-6) and agree("1", 1.0) and not agree("0.7", 0.8)
    assert agree("grpo", "grpo") and not agree("gspo", "grpo") and not agree("16", None)


def test_bad_rows_are_named(data):
    broken = {"runs": {"x": {"recipe": "stage1_math.yaml", "rows": [{"setting": "lr", "key": "--lr", "authrs": 1}]}}}
    with pytest.raises(FidelityError, match="unknown fields"):
        run_rows(broken, "x")


def test_the_parity_checks_tis_call_reads_as_no_correction():
    """A LoRA expert passes --use-tis only to reach slime's TIS call for its parity check: TIS stays off."""
    recipe, command = fidelity.compiled("mle_math.yaml")
    assert "--use-tis" in command.train_args
    for key in ("--use-tis", "--custom-tis-function-path", "tis.cap"):
        assert fidelity.our_value(key, recipe, command) is None, key
    recipe, command = fidelity.compiled("stage2_search.yaml")  # a correction: read as it is
    assert fidelity.our_value("--use-tis", recipe, command) is True
    assert fidelity.our_value("tis.cap", recipe, command) == 2.0


# A checkout of WillDreamer/ACLArena beside the repository (`git --git-dir=... archive HEAD | tar -x`), if any.
AUTHORS_CHECKOUT = fidelity.REPO_ROOT.parent / "shared" / "ACLArena"


def _authors_dir(tmp_path):
    script = tmp_path / "slime" / "examples" / "demo" / "run.sh"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/bash\nROLLOUT_BATCH_SIZE=64\nARGS=(\n   --num-rollout 300\n   --lr 1e-6\n)\n")
    (tmp_path / "README.md").write_text("# Title\nThe chain ends in Qwen3-8B-Base-Math.\n")
    return tmp_path


def _data(*rows):
    return {"runs": {"demo": {"recipe": "stage1_math.yaml", "rows": [dict(r) for r in rows]}}}


ROLLOUTS = {"setting": "rollouts", "key": "--num-rollout", "authors": 300, "source": "demo/run.sh:4"}


def test_a_cited_line_must_hold_the_rows_flag(tmp_path):
    authors = _authors_dir(tmp_path)
    assert fidelity.check_citations(authors, _data(ROLLOUTS)) == ([], 1)
    shifted = {**ROLLOUTS, "source": "demo/run.sh:5"}
    problems, _ = fidelity.check_citations(authors, _data(shifted))
    assert problems == ["demo: rollouts (demo/run.sh:5): no cited line holds '--num-rollout'"]


def test_a_citation_past_the_end_or_to_a_missing_file_fails(tmp_path):
    authors = _authors_dir(tmp_path)
    past = {**ROLLOUTS, "source": "demo/run.sh:4,40"}
    missing = {**ROLLOUTS, "setting": "gone", "source": "demo/other.sh:4"}
    problems, _ = fidelity.check_citations(authors, _data(past, missing))
    assert problems[0] == "demo: rollouts (demo/run.sh:4,40): demo/run.sh has 6 lines, cited [40]"
    assert problems[1].startswith("demo: gone (demo/other.sh:4): no file demo/other.sh in ")


def test_cites_names_what_a_line_holds_when_it_is_not_the_flag(tmp_path):
    authors = _authors_dir(tmp_path)
    batch = {"setting": "batch", "key": "--rollout-batch-size", "authors": 64, "source": "demo/run.sh:2",
             "cites": "ROLLOUT_BATCH_SIZE=64"}  # fmt: skip
    readme = {"setting": "model", "key": "recipe.model.name", "authors": "x", "source": "README.md:2",
              "cites": "Qwen3-8B-Base-Math"}  # fmt: skip
    assert fidelity.check_citations(authors, _data(batch, readme)) == ([], 2)
    problems, _ = fidelity.check_citations(authors, _data({**readme, "source": "README.md:1"}))
    assert problems == ["demo: model (README.md:1): no cited line holds 'Qwen3-8B-Base-Math'"]


def test_the_check_command_fails_on_a_shifted_citation(tmp_path, monkeypatch, capsys):
    authors = _authors_dir(tmp_path)
    monkeypatch.setattr(fidelity, "load_data", lambda path=None: _data({**ROLLOUTS, "source": "demo/run.sh:3"}))
    monkeypatch.setattr(fidelity, "table", lambda data=None: [])
    monkeypatch.setattr(fidelity, "render", lambda rows, data=None: fidelity.TABLE.read_text(encoding="utf-8"))
    assert fidelity.main(["--check", "--authors", str(authors)]) == 1
    assert "no cited line holds '--num-rollout'" in capsys.readouterr().err


@pytest.mark.skipif(not AUTHORS_CHECKOUT.is_dir(), reason=f"no authors' checkout at {AUTHORS_CHECKOUT}")
def test_the_table_s_citations_hold_in_the_authors_checkout():
    problems, checked = fidelity.check_citations(AUTHORS_CHECKOUT)
    assert not problems and checked > 200, "\n".join(problems)
