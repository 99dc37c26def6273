"""SDFT data: synthetic slime dumps and JSONL → filtered, converted, de-duplicated, domain-tagged records."""

from __future__ import annotations

import json

import pytest
import torch

from aclarena_slime.cli import main
from aclarena_slime.distill.dumps import DumpError, dump_files, episode_from_record, read_dump
from aclarena_slime.distill.sdft import MixtureError, MixtureSettings, build_mixture, chat_messages, write_mixture


def _save(path, samples):
    torch.save({"rollout_id": 0, "samples": samples}, path)
    return path


def _oracle_dumps(tmp_path, make_sample):
    math = _save(
        tmp_path / "math.pt",
        [
            make_sample("math", "1+1?", "\\boxed{2}", 1.0),
            make_sample("math", "1+1?", "\\boxed{3}", 0.0),  # below threshold
            make_sample("math", "1+1?", "\\boxed{2}", 1.0),  # exact duplicate of the first
            make_sample("math", "2+2?", "\\boxed{4", 1.0, status="truncated"),
            make_sample("math", "3+3?", "<think>ok</think>\\boxed{6}", 1.0),
        ],
    )
    retail = tmp_path / "retail"
    retail.mkdir()
    _save(
        retail / "0.pt",
        [
            make_sample("retail", "Where is my order?", "It was delivered.", 1.0, tool_turn=True),
            make_sample("retail", "Cancel it", "Done.", 0.5, tool_turn=True),  # below retail's 1.0
            make_sample("retail", "Refund?", "Sure.", 1.0, status="aborted", tool_turn=True),
        ],
    )
    return math, retail


def test_filter_convert_dedupe_per_domain_threshold(tmp_path, make_sample):
    math, retail = _oracle_dumps(tmp_path, make_sample)
    episodes = [ep for f in dump_files([math, retail]) for ep in read_dump(f)]
    settings = MixtureSettings(thresholds={"retail": 1.0}, default_threshold=0.5)
    records, report = build_mixture(episodes, settings)

    assert [r["metadata"]["domain"] for r in records] == ["math", "math", "retail"]
    assert records[0]["messages"] == [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "\\boxed{2}"},
    ]
    assert "tools" not in records[0]  # math has no tools: slime asserts tools is a list when the key exists
    assert records[1]["messages"][-1]["content"] == "<think>ok</think>\\boxed{6}"
    retail_record = records[2]
    assert [m["role"] for m in retail_record["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert "<tool_call>" in retail_record["messages"][1]["content"]
    assert retail_record["messages"][2] == {
        "role": "tool",
        "content": '{"order": "#W1", "status": "delivered"}',
        "name": "get_order",
    }
    assert retail_record["tools"][0]["function"]["name"] == "get_order"
    assert retail_record["metadata"] == {
        "domain": "retail",
        "source_name": "retail",
        "reward": 1.0,
        "origin": f"{retail / '0.pt'}:0",
    }
    assert report.to_dict() == {
        "math": {"read": 5, "kept": 2, "dropped": {"below_threshold": 1, "duplicate": 1, "status_truncated": 1}},
        "retail": {"read": 3, "kept": 1, "dropped": {"below_threshold": 1, "status_aborted": 1}},
    }


def test_records_render_through_the_chat_template_with_tool_results(tmp_path, make_sample, tiny_tokenizer):
    _, retail = _oracle_dumps(tmp_path, make_sample)
    records, _ = build_mixture(read_dump(retail / "0.pt"), MixtureSettings(default_threshold=1.0))
    (record,) = records
    text = tiny_tokenizer.apply_chat_template(record["messages"], tools=record["tools"], tokenize=False)
    assert '"name": "get_order"' in text.split("</tools>")[0]  # the schema went into the system turn
    assert "<tool_response>\n" + '{"order": "#W1", "status": "delivered"}' in text
    assert text.rstrip().endswith("It was delivered.<|im_end|>")


def test_max_per_prompt_keeps_distinct_trajectories_up_to_the_cap(make_sample):
    episodes = [
        episode_from_record(make_sample("math", "1+1?", f"\\boxed{{2}} way {i}", 1.0), f"x:{i}") for i in range(5)
    ]
    records, report = build_mixture(episodes, MixtureSettings(default_threshold=1.0, max_per_prompt=2))
    assert [r["messages"][-1]["content"] for r in records] == ["\\boxed{2} way 0", "\\boxed{2} way 1"]
    assert report.domains["math"].dropped == {"prompt_cap": 3}


def test_fallbacks_and_rejections(make_sample):
    # a sample from slime's own generate: chat prompt + response, reward on the sample
    plain = make_sample("math", "q", "a", None, with_record=False)
    plain.update(prompt=[{"role": "user", "content": "q"}], reward=1.0)
    ep = episode_from_record(plain, "x:0")
    assert ep.messages == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert ep.reward == 1.0 and ep.domain == "math"
    # a templated string prompt without our record cannot be turned back into messages
    templated = make_sample("math", "q", "a", 1.0, with_record=False)
    no_messages = episode_from_record(templated, "x:1")
    assert no_messages.messages is None
    # dict rewards (slime --reward-key) and enum-valued statuses
    keyed = make_sample("search", "q", "a", None)
    keyed["reward"] = {"reward": 0.7, "em": 0.0}
    assert episode_from_record(keyed, "x:2").reward == pytest.approx(0.7)
    records, report = build_mixture([no_messages], MixtureSettings(default_threshold=0.0))
    assert records == [] and report.domains["math"].dropped == {"no_messages": 1}


def test_chat_messages_trims_trailing_observations_and_rejects_malformed():
    convo = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "r", "extra": 1},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "hint nobody answered"},
    ]
    out = chat_messages(convo)
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "assistant"]
    assert out[1]["content"] == "" and out[1]["tool_calls"][0]["function"]["name"] == "f"
    assert "extra" not in out[2]
    assert chat_messages([{"role": "user", "content": "no answer"}]) is None
    assert chat_messages([{"role": "wizard", "content": "x"}, {"role": "assistant", "content": "y"}]) is None
    assert chat_messages([{"role": "assistant", "content": [{"type": "image"}]}]) is None


def test_errors_name_the_problem(tmp_path, make_sample):
    with pytest.raises(MixtureError, match="no reward threshold for domain 'math'"):
        build_mixture([episode_from_record(make_sample("math", "q", "a", 1.0), "x:0")], MixtureSettings())
    nameless = make_sample("math", "q", "a", 1.0)
    nameless["metadata"].pop("env")
    with pytest.raises(MixtureError, match="x:0: no domain"):
        build_mixture([episode_from_record(nameless, "x:0")], MixtureSettings(default_threshold=0))
    # ... unless the caller names the dump's domain
    assert episode_from_record(nameless, "x:0", domain="math").domain == "math"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\nnot json\n')
    with pytest.raises(DumpError, match="bad.jsonl:2: not JSON"):
        list(read_dump(bad))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(DumpError, match="junk.pt: cannot be read"):
        list(read_dump(junk))
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(DumpError, match="expected a dict with a 'samples' list"):
        list(read_dump(tmp_path / "list.pt"))
    with pytest.raises(DumpError, match="does not exist"):
        dump_files([tmp_path / "missing"])
    out = write_mixture([{"messages": []}], tmp_path / "mix.jsonl")
    with pytest.raises(MixtureError, match="exists"):
        write_mixture([], out)


def test_jsonl_eval_lines_with_messages(tmp_path):
    lines = [
        {
            "env": "search",
            "status": "completed",
            "reward": 1.0,
            "messages": [
                {"role": "user", "content": "Who?"},
                {"role": "assistant", "content": "<answer> Paris </answer>"},
            ],
        },
        {"env": "search", "status": "failed", "reward": None, "messages": []},
    ]
    path = tmp_path / "search.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    records, report = build_mixture(read_dump(path), MixtureSettings(default_threshold=1.0))
    assert len(records) == 1 and records[0]["metadata"]["origin"] == f"{path}:1"
    assert report.domains["search"].dropped == {"status_failed": 1}


def test_cli_writes_the_mixture_and_reports(tmp_path, make_sample, capsys):
    math, retail = _oracle_dumps(tmp_path, make_sample)
    out = tmp_path / "sdft" / "mix.jsonl"
    argv = [
        "distill",
        "sdft-data",
        "--dumps",
        str(math),
        f"tau={retail}",
        "--threshold",
        "0.5",
        "--threshold",
        "tau=1.0",
        "--out",
        str(out),
        "--json",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] == 3 and set(summary["domains"]) == {"math", "tau"}
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["metadata"]["domain"] for r in records] == ["math", "math", "tau"]
    assert main(argv) == 2  # refuses to overwrite
    assert "exists" in capsys.readouterr().err
    assert main([*argv[:-1], "--force", "--threshold", "tau=x"]) == 2
    assert "must be a number" in capsys.readouterr().err


def test_pickled_objects_need_trust(tmp_path, make_sample):
    import datetime

    sample = make_sample("math", "q", "a", 1.0)
    sample["metadata"]["started"] = datetime.datetime(2026, 1, 1)
    path = _save(tmp_path / "rich.pt", [sample])
    with pytest.raises(DumpError, match="--trust-pickle"):
        list(read_dump(path))
    (episode,) = read_dump(path, trust_pickle=True)
    assert episode.reward == 1.0


def test_warm_start_filters_as_the_authors(tmp_path, make_sample, capsys):
    """SeaSFT (search-r1/filter_rollout_data.py:77-86): reward >= 0.4, truncated kept, failed/aborted and
    all-zero-loss-mask samples dropped. TauSFT (tau-bench/parse_rollout_to_sft.py:86-137): reward >= 1.0,
    completed only, at most max_tokens, all-zero loss mask dropped."""
    no_tool = make_sample("search", "q4", "<answer>x</answer>", 1.0)
    no_tool["loss_mask"] = [0, 0]  # the no-tool filter masked it: nothing to train on
    removed = make_sample("search", "q5", "<answer>y</answer>", 1.0)
    removed["remove_sample"] = True
    search = _save(
        tmp_path / "search.pt",
        [
            make_sample("search", "q1", "<answer>a</answer>", 0.5),
            make_sample("search", "q2", "<answer>b", 0.6, status="truncated"),
            make_sample("search", "q3", "<answer>c</answer>", 0.3),
            make_sample("search", "q6", "<answer>d</answer>", 1.0, status="aborted"),
            no_tool,
            removed,
        ],
    )
    episodes = list(read_dump(search))
    sea = MixtureSettings(default_threshold=0.4, statuses=("completed", "truncated"))
    records, report = build_mixture(episodes, sea)
    assert [r["messages"][0]["content"] for r in records] == ["q1", "q2"]
    assert report.to_dict()["search"]["dropped"] == {
        "below_threshold": 1, "no_trainable_tokens": 2, "status_aborted": 1,
    }  # fmt: skip
    # TauSFT: completed only, and a length cap on prompt + response tokens
    long = make_sample("retail", "r2", "Done.", 1.0, tool_turn=True)
    long["tokens"] = list(range(50))
    tau = [episode_from_record(make_sample("retail", "r1", "Done.", 1.0, tool_turn=True), "a:0"),
           episode_from_record(make_sample("retail", "r3", "Done.", 1.0, "truncated", tool_turn=True), "a:1"),
           episode_from_record(long, "a:2")]  # fmt: skip
    records, report = build_mixture(tau, MixtureSettings(default_threshold=1.0, max_tokens=40))
    assert [r["messages"][0]["content"] for r in records] == ["r1"]
    assert report.to_dict()["retail"]["dropped"] == {"status_truncated": 1, "too_long": 1}
    with pytest.raises(MixtureError, match="statuses"):
        MixtureSettings(default_threshold=1.0, statuses=("finished",))
    # the same through the CLI
    out = tmp_path / "seasft.jsonl"
    argv = ["distill", "sdft-data", "--dumps", f"search={search}", "--threshold", "0.4",
            "--status", "completed", "truncated", "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 2
