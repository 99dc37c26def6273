"""From per-sample results to the numbers a table shows: accuracy per dataset and per domain.

Accuracy is in percent (0-100), as the paper reports it: the mean reward over every sample of every
prompt (avg@n). A sample that was not scored (engine or env service failure) counts as 0 and is
reported in ``n_unscored``, so a broken service can never make a model look better than it is.
``pass_at_n`` is the mean over prompts of the best sample's reward (pass@n for 0/1 rewards).

The summary document (``summary.json``) is what the forgetting matrix reads::

    {"stage": "stage1_math", "suite": "paper", "domains": {"math": 25.8, "search": 40.1},
     "datasets": {"aime24": {"domain": "math", "accuracy": 25.8, ...}}}

A domain's accuracy is the unweighted mean of the accuracies of its datasets.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any

from aclarena_slime.evaluation.suite import EvalDataset

SUMMARY_VERSION = 1


def latest_by_key(lines: list[dict[str, Any]], n_prompts: int, n_samples: int) -> dict[tuple[int, int], dict[str, Any]]:
    """One result per (record index, sample); a later line (a resumed run) replaces an earlier one.

    Lines outside the current run (``index >= n_prompts`` or ``sample >= n_samples``: an earlier run
    with a larger ``limit`` or ``n_samples`` wrote them) are left out, so they never count.
    """
    results = {}
    for line in lines:
        key = (int(line["index"]), int(line["sample"]))
        if key[0] < n_prompts and key[1] < n_samples:
            results[key] = line
    return results


def summarize_dataset(
    dataset: EvalDataset, n_prompts: int, lines: list[dict[str, Any]], lora_path: str | None
) -> dict[str, Any]:
    results = latest_by_key(lines, n_prompts, dataset.n_samples)
    total = n_prompts * dataset.n_samples
    rewards: dict[int, list[float]] = defaultdict(list)
    statuses: dict[str, int] = defaultdict(int)
    lengths = []
    for (index, _), line in results.items():
        if line.get("reward") is not None:
            rewards[index].append(float(line["reward"]))
        statuses[line.get("status", "unknown")] += 1
        lengths.append(int(line.get("response_tokens", 0)))
    scored = sum(len(r) for r in rewards.values())
    return {
        "env": dataset.env,
        "domain": dataset.domain,
        "path": dataset.path,
        "lora_path": lora_path,
        "n_prompts": n_prompts,
        "n_samples_per_prompt": dataset.n_samples,
        "n_scored": scored,
        "n_unscored": total - scored,
        "accuracy": 100.0 * sum(sum(r) for r in rewards.values()) / total if total else 0.0,
        "pass_at_n": 100.0 * sum(max(r) for r in rewards.values()) / n_prompts if n_prompts else 0.0,
        "mean_response_tokens": mean(lengths) if lengths else 0.0,
        "statuses": dict(sorted(statuses.items())),
        "sampling": {
            **dataset.sampling_params(),
            "max_response_len": dataset.max_response_len,
            "max_turns": dataset.max_turns,
        },
    }


def build_summary(suite: str, stage: str | None, datasets: dict[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The summary document: per-dataset results plus per-domain accuracy."""
    by_domain: dict[str, list[float]] = defaultdict(list)
    for result in datasets.values():
        by_domain[result["domain"]].append(result["accuracy"])
    return {
        "version": SUMMARY_VERSION,
        "stage": stage,
        "suite": suite,
        "domains": {domain: mean(values) for domain, values in by_domain.items()},
        "datasets": datasets,
        **extra,
    }
