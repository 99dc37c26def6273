"""Token-entropy stability on two tiny random Qwen3 checkpoints, checked against a direct torch computation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from aclarena_slime.analysis.entropy import EntropyError, TokenStats, compare, stats_from_top_logprobs
from aclarena_slime.analysis.entropy_sources import read_sequences, read_top_logprobs, top_logprob_stats
from aclarena_slime.cli import main
from aclarena_slime.local.tiny_model import save_tiny_checkpoint

TEXTS = [
    ("What is 2 + 2 = ", "<think> Let me think. </think> The answer is \\boxed{4}."),
    ("capital of France", "<search> capital of France </search> Paris is the capital."),
    ("Write in lowercase", "the quick brown fox jumps over the lazy dog, hello world"),
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("entropy")
    return [save_tiny_checkpoint(root / f"ckpt{seed}", with_model=True, seed=seed) for seed in (0, 1)]


@pytest.fixture(scope="module")
def samples(checkpoints, tmp_path_factory):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoints[0])
    path = tmp_path_factory.mktemp("samples") / "samples.jsonl"
    lines = []
    for i, (prompt, response) in enumerate(TEXTS):
        response_ids = tok.encode(response, add_special_tokens=False)
        mask = [1] * len(response_ids)
        if i == 1:
            mask[3:6] = [0, 0, 0]  # an observation span: not the model's tokens, not analysed
        lines.append(
            {
                "prompt_ids": tok.encode(prompt, add_special_tokens=False),
                "response_ids": response_ids,
                "loss_mask": mask,
            }
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path, lines


def _direct(checkpoint, lines, model=None):
    """Entropy (nats) and argmax at every masked-in response position, written out by hand."""
    from transformers import AutoModelForCausalLM

    model = model or AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    entropies, tops = [], []
    with torch.no_grad():
        for line in lines:
            ids = line["prompt_ids"] + line["response_ids"]
            logits = model(input_ids=torch.tensor([ids])).logits[0].double()
            for i, keep in enumerate(line["loss_mask"]):
                if keep:
                    row = logits[len(line["prompt_ids"]) + i - 1]
                    p = torch.softmax(row, -1)
                    entropies.append(float(-(p * torch.log(p)).sum()))
                    tops.append(int(row.argmax()))
    return entropies, tops, logits


def test_cli_numbers_match_a_direct_computation(checkpoints, samples, tmp_path, capsys):
    path, lines = samples
    out = tmp_path / "out"
    argv = ["analyze", "entropy", "--checkpoint", str(checkpoints[0]), "--checkpoint", str(checkpoints[1])]
    assert (
        main([*argv, "--samples", str(path), "--label", "k", "--label", "k+1", "--out", str(out), "--bins", "4"]) == 0
    )
    table = capsys.readouterr().out
    assert table.startswith("| checkpoints | tokens |") and "| k → k+1 |" in table
    report = json.loads((out / "entropy.json").read_text())["pairs"][0]

    h0, top0, _ = _direct(checkpoints[0], lines)
    _, top1, _ = _direct(checkpoints[1], lines)
    n = sum(sum(line["loss_mask"]) for line in lines)
    assert len(h0) == n == report["n_tokens"]
    threshold = float(np.quantile(h0, 0.8))
    high = [h > threshold for h in h0]
    same = [a == b for a, b in zip(top0, top1, strict=True)]
    low_stable = 100 * sum(s for s, hi in zip(same, high, strict=True) if not hi) / high.count(False)
    high_rewritten = 100 * sum(not s for s, hi in zip(same, high, strict=True) if hi) / high.count(True)
    assert report["threshold"] == pytest.approx(threshold, rel=1e-9)
    assert (report["n_low"], report["n_high"]) == (high.count(False), high.count(True))
    assert report["low_stable"] == pytest.approx(low_stable)
    assert report["high_rewritten"] == pytest.approx(high_rewritten)
    assert report["stable"] == pytest.approx(100 * sum(same) / n)
    assert len(report["bin_entropy"]) == 4 and report["bin_entropy"] == sorted(report["bin_entropy"])
    assert (out / "entropy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "entropy.csv").read_text().splitlines()[0].startswith("label,n_tokens,threshold")


def test_a_fixed_threshold_and_a_peft_adapter_checkpoint(checkpoints, samples, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(checkpoints[0])
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, lora).save_pretrained(tmp_path / "expert")
    path, lines = samples
    out = tmp_path / "out"
    argv = ["analyze", "entropy", "--checkpoint", str(checkpoints[0]), "--checkpoint", str(tmp_path / "expert")]
    assert main([*argv, "--samples", str(path), "--threshold", "5.0", "--out", str(out), "--json"]) == 0
    pair = json.loads(capsys.readouterr().out)["pairs"][0]
    h0, top0, base_logits = _direct(checkpoints[0], lines)
    expert = get_peft_model(AutoModelForCausalLM.from_pretrained(checkpoints[0]), lora)
    expert.load_adapter(str(tmp_path / "expert"), adapter_name="default")
    _, top1, expert_logits = _direct(None, lines, expert.eval())
    assert not torch.allclose(base_logits, expert_logits)  # the adapter really changes the model
    assert pair["threshold"] == 5.0 and pair["n_high"] == sum(h > 5.0 for h in h0)
    assert pair["label"] == "ckpt0 → expert" and pair["n_tokens"] == len(h0)
    assert pair["stable"] == pytest.approx(100 * sum(a == b for a, b in zip(top0, top1, strict=True)) / len(h0))


def test_top_k_entropy_is_exact_with_the_whole_vocabulary_and_a_lower_bound_otherwise(checkpoints, samples):
    _, lines = samples
    _, _, logits = _direct(checkpoints[0], lines[-1:])
    log_p = torch.log_softmax(logits, -1)
    exact = -(log_p.exp() * log_p).sum(-1).numpy()

    def top_k(k):
        values, ids = log_p.topk(k, dim=-1)
        return [
            [[float(v), int(i), None] for v, i in zip(vs, is_, strict=True)]
            for vs, is_ in zip(values, ids, strict=True)
        ]

    full = stats_from_top_logprobs(top_k(log_p.shape[-1]))
    np.testing.assert_allclose(full.entropy, exact, rtol=1e-9, atol=1e-9)
    assert (full.top == log_p.argmax(-1).numpy()).all()
    five = stats_from_top_logprobs(top_k(5))
    assert (five.entropy <= exact + 1e-9).all() and (five.entropy > 0).all()
    assert (five.top == full.top).all()


def test_top_k_files_in_sglang_layout(tmp_path):
    a = [[[math.log(0.9), 7, "a"], [math.log(0.1), 8, "b"]], [[math.log(0.5), 1, None], [math.log(0.5), 2, None]]]
    b = [[[math.log(0.2), 7, "a"], [math.log(0.8), 8, "b"]], [[math.log(0.6), 1, None], [math.log(0.4), 2, None]]]
    (tmp_path / "a.jsonl").write_text(json.dumps({"id": "x", "top_logprobs": a}) + "\n")
    raw = {"id": "x", "meta_info": {"input_top_logprobs": [None, *b]}}  # a whole SGLang answer
    (tmp_path / "b.jsonl").write_text(json.dumps(raw) + "\n" + json.dumps({"id": "only-b", "top_logprobs": b}) + "\n")
    assert read_top_logprobs(tmp_path / "b.jsonl")["x"] == b
    before, after = top_logprob_stats([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    np.testing.assert_allclose(before.entropy, [-(0.9 * math.log(0.9) + 0.1 * math.log(0.1)), math.log(2)])
    assert before.top.tolist() == [7, 1] and after.top.tolist() == [8, 1]
    report = compare(before, after, threshold=0.5)
    assert (report.n_low, report.low_stable, report.n_high, report.high_rewritten) == (1, 0.0, 1, 0.0)


def test_errors_are_clear(tmp_path):
    with pytest.raises(EntropyError, match="same positions"):
        TokenStats(np.zeros(2), np.zeros(3, dtype=np.int64))
    with pytest.raises(EntropyError, match="covers? .*positions"):
        compare(
            TokenStats(np.zeros(2), np.zeros(2, dtype=np.int64)), TokenStats(np.zeros(1), np.zeros(1, dtype=np.int64))
        )
    (tmp_path / "s.jsonl").write_text('{"response_ids": [1, 2], "loss_mask": [1]}\n')
    with pytest.raises(EntropyError, match="loss_mask has 1 entries for 2 tokens"):
        read_sequences(tmp_path / "s.jsonl")
    (tmp_path / "t.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(EntropyError, match="needs response_ids"):
        read_sequences(tmp_path / "t.jsonl")
    (tmp_path / "u.jsonl").write_text('{"prompt_ids": [1], "response_ids": [2]}\n\n[1, 2]\n')
    with pytest.raises(EntropyError, match="u.jsonl:3: expected a JSON object, got list"):
        read_sequences(tmp_path / "u.jsonl")
    with pytest.raises(EntropyError, match="u.jsonl:3: expected a JSON object"):
        read_top_logprobs(tmp_path / "u.jsonl")
    assert len(read_sequences(tmp_path / "u.jsonl", limit=1)) == 1  # the limit stops before the bad line
    with pytest.raises(EntropyError, match="cannot read"):
        read_sequences(tmp_path / "missing.jsonl")


def test_cli_needs_two_checkpoints_and_samples(checkpoints, tmp_path, capsys):
    assert main(["analyze", "entropy", "--checkpoint", str(checkpoints[0]), "--out", str(tmp_path)]) == 2
    assert "--checkpoint needs --samples" in capsys.readouterr().err
    (tmp_path / "a.jsonl").write_text('{"id": 1, "top_logprobs": [[[-0.1, 3, null]]]}\n')
    assert main(["analyze", "entropy", "--top-k", str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "at least two checkpoints" in capsys.readouterr().err
