"""The smoke run's report, read from what slime itself wrote: its dumped samples and its job log.

Per env (``metadata.env``) and per phase (train rollouts, eval): samples, statuses, mean reward, the
token/mask/log-prob invariants our generate promises slime, model turns and how episodes ended; then
anything slime logged as an error, the engine endpoints slime called, and our reward post-process
applied to the dumped train samples (slime never calls it with ``--debug-rollout-only``).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aclarena_slime.local.sglang_server import called_endpoints

RECORD_KEY = "aclarena"  # where aclarena_slime.rollout keeps its per-sample record in metadata
ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|\bERROR\b|Error:|Exception:")


def read_dumps(dump: Path) -> dict[str, list[dict[str, Any]]]:
    """``{"train": [...], "eval": [...]}``: the sample dicts of every ``{rollout_id}.pt`` slime saved."""
    import torch

    out: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    for path in sorted(dump.glob("*.pt")):
        phase = "eval" if path.stem.startswith("eval_") else "train"
        out[phase] += torch.load(path, weights_only=False)["samples"]
    return out


def sample_problems(sample: dict[str, Any]) -> list[str]:
    """What breaks the token-in/token-out invariants in one dumped sample (empty: none)."""
    problems = []
    n = sample.get("response_length")
    tokens, mask, log_probs = sample.get("tokens") or [], sample.get("loss_mask"), sample.get("rollout_log_probs")
    if not isinstance(n, int) or n < 0:
        return [f"response_length {n!r}"]
    if len(tokens) <= n:
        problems.append(f"tokens ({len(tokens)}) not longer than response_length ({n}): no prompt")
    if mask is None or len(mask) != n:
        problems.append(f"loss_mask length {None if mask is None else len(mask)} != response_length {n}")
    elif any(m not in (0, 1) for m in mask):
        problems.append("loss_mask values other than 0/1")
    if log_probs is None or len(log_probs) != n:
        problems.append(f"rollout_log_probs length {None if log_probs is None else len(log_probs)} != {n}")
    elif mask is not None and len(mask) == n:
        model = [lp for lp, m in zip(log_probs, mask, strict=True) if m == 1]
        if any(not math.isfinite(lp) or lp > 1e-6 for lp in model):
            problems.append("a model token's log-prob is not finite or > 0")
    return problems


def phase_figures(samples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per env tag: the figures the report prints."""
    by_env: dict[str, list[dict[str, Any]]] = {}
    for sample in samples:
        tag = str((sample.get("metadata") or {}).get("env", "?"))
        by_env.setdefault(tag, []).append(sample)
    out = {}
    for tag, group in sorted(by_env.items()):
        rewards = [_reward(s) for s in group]
        numeric = [r for r in rewards if r is not None]
        records = [(s.get("metadata") or {}).get(RECORD_KEY) or {} for s in group]
        turns = [len(r.get("turns") or []) for r in records]
        problems = [f"sample {s.get('index')}: {p}" for s in group for p in sample_problems(s)]
        out[tag] = {
            "samples": len(group),
            "statuses": dict(Counter(str(s.get("status")) for s in group)),
            "mean_reward": statistics.fmean(numeric) if numeric else None,
            "rewarded": len(numeric),
            "response_len_mean": statistics.fmean(s.get("response_length") or 0 for s in group),
            "model_token_frac": sum(sum(s.get("loss_mask") or []) for s in group)
            / max(sum(s.get("response_length") or 0 for s in group), 1),
            "turns_mean": statistics.fmean(turns) if turns else 0.0,
            "turns_max": max(turns, default=0),
            "ends": dict(Counter(str(r.get("end")) for r in records)),
            "env_errors": sum(1 for r in records if r.get("error")),
            "invariant_violations": problems,
        }
    return out


def _reward(sample: dict[str, Any]) -> float | None:
    value = sample.get("reward")
    if isinstance(value, dict):
        value = value.get("reward")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def check_post_process(samples: list[dict[str, Any]], path: str, n_samples_per_prompt: int) -> dict[str, Any]:
    """Run ``--custom-reward-post-process-path`` on the dumped train samples, as slime would after a rollout.

    Checks that the raw rewards are the samples' rewards and that each group's normalized rewards
    (GRPO / GSPO: mean removed) sum to zero over the samples kept.
    """
    from slime.utils.misc import load_function
    from slime.utils.types import Sample

    objects = [Sample.from_dict(dict(s)) for s in samples]
    args = SimpleNamespace(
        advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
        n_samples_per_prompt=n_samples_per_prompt, aclarena_env_config={},
    )  # fmt: skip
    raw, rewards = load_function(path)(args, objects)
    problems = []
    if [float(r) for r in raw] != [_reward(s) for s in samples]:
        problems.append("raw rewards differ from the samples' rewards")
    groups: dict[Any, list[float]] = {}
    for sample, value in zip(objects, rewards, strict=True):
        if not sample.remove_sample:
            groups.setdefault(sample.group_index, []).append(value)
    if any(abs(sum(values)) > 1e-4 for values in groups.values()):
        problems.append("a group's normalized rewards do not sum to 0")
    return {"path": path, "groups": len(groups), "problems": problems}


def job_errors(log_text: str, limit: int = 20) -> list[str]:
    """The job log's lines that say error (slime's logger, Python tracebacks), first ``limit`` of them."""
    return [line.strip() for line in log_text.splitlines() if ERROR_LINE.search(line)][:limit]


def build_report(
    *,
    dump: Path,
    job_log: Path,
    engine_log: tuple[Path, int] | None,
    settings: dict[str, Any],
    job_status: int,
    seconds: float,
    post_process: list[str] | None,
    n_samples_per_prompt: int,
    leftovers: list[int] | None = None,
) -> dict[str, Any]:
    dumps = read_dumps(dump) if dump.is_dir() else {"train": [], "eval": []}
    phases = {phase: phase_figures(samples) for phase, samples in dumps.items()}
    log_text = job_log.read_text(encoding="utf-8", errors="replace") if job_log.is_file() else ""
    engine_text = ""
    if engine_log is not None and engine_log[0].is_file():
        with open(engine_log[0], "rb") as log:  # from the offset where slime's job began
            log.seek(engine_log[1])
            engine_text = log.read().decode("utf-8", errors="replace")
    report: dict[str, Any] = {
        "job_status": job_status,
        "seconds": round(seconds, 1),
        "settings": settings,
        "phases": phases,
        "errors_logged": job_errors(log_text),
        "engine_calls": dict(sorted(called_endpoints(engine_text).items())),
        "still_running_after_stop": list(leftovers or []),
    }
    if post_process and dumps["train"]:
        try:
            report["post_process"] = check_post_process(dumps["train"], post_process[0], n_samples_per_prompt)
        except Exception as exc:  # noqa: BLE001 - reported, and it fails the smoke
            report["post_process"] = {"path": post_process[0], "problems": [f"{type(exc).__name__}: {exc}"]}
    violations = [p for figures in phases.values() for env in figures.values() for p in env["invariant_violations"]]
    report["ok"] = bool(
        job_status == 0
        and dumps["train"]
        and not violations
        and not (report.get("post_process") or {}).get("problems")
        and not report["still_running_after_stop"]
    )
    return report


def report_text(report: dict[str, Any]) -> str:
    """The report as the terminal shows it."""
    lines = [
        f"smoke: slime job status {report['job_status']}, {report['seconds']} s "
        f"({report['settings']['rollouts']} rollouts x {report['settings']['prompts']} prompts x "
        f"{report['settings']['samples']} samples)",
    ]
    for phase, figures in report["phases"].items():
        if not figures:
            lines.append(f"  {phase}: no samples dumped")
        for tag, f in figures.items():
            reward = "n/a" if f["mean_reward"] is None else f"{f['mean_reward']:.3f}"
            lines.append(
                f"  {phase:5} {tag:10} samples {f['samples']:3}  statuses {f['statuses']}  mean reward {reward}  "
                f"turns {f['turns_mean']:.1f} (max {f['turns_max']})  ends {f['ends']}  "
                f"response {f['response_len_mean']:.1f} tok ({f['model_token_frac']:.0%} model)  "
                f"env errors {f['env_errors']}  invariants "
                + ("ok" if not f["invariant_violations"] else f"{len(f['invariant_violations'])} VIOLATED")
            )
            lines += [f"      ! {p}" for p in f["invariant_violations"][:5]]
    post = report.get("post_process")
    if post:
        verdict = "ok" if not post["problems"] else "; ".join(post["problems"])
        lines.append(f"  reward post-process {post['path']} on the dumped train samples: {verdict}")
    calls = ", ".join(f"{k} x{v}" for k, v in report["engine_calls"].items()) or "none"
    lines.append(f"  engine endpoints slime called: {calls}")
    errors = report["errors_logged"]
    lines.append(f"  errors slime logged: {len(errors)}" + ("" if not errors else ""))
    lines += [f"      ! {e[:200]}" for e in errors[:10]]
    leftovers = report.get("still_running_after_stop") or []
    lines.append("  everything started was stopped" if not leftovers else f"  STILL RUNNING after stop: {leftovers}")
    lines.append("smoke: OK" if report["ok"] else "smoke: FAILED")
    return "\n".join(lines)
