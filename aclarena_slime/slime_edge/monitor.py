"""The forgetting monitor inside slime: the alarm, ``keep`` and ``stop`` on slime's own eval results.

Read against THUDM/slime 624b824. ``train.py`` calls ``RolloutManager.eval(rollout_id)`` before the first
rollout (``rollout_id`` 0, unless ``--skip-eval-before-train``) and after rollout ``rollout_id`` is trained
and its weights (our adapter) synced, every ``--eval-interval`` rollouts. ``eval`` runs the
``--eval-config`` datasets and hands the results to ``log_eval_rollout_data``
(``slime/observability/rollout_metrics.py``), which first calls ``--custom-eval-rollout-log-function-path``:
``fn(rollout_id, args, data, extra_metrics) -> bool`` with ``data[name] = {"rewards", "truncated",
"samples"}`` — in the RolloutManager actor, on the node Ray placed it.

:func:`log_eval` is that function. It feeds each watched dataset's mean reward (in points, per domain) to
:class:`~aclarena_slime.evaluation.monitor.ForgettingMonitor`, writes the report to
``<run_dir>/monitor/monitor.json`` at every check, and acts:
- ``keep``: at each check before any fall, copies the adapter the disk sync wrote after this step (the policy
  just evaluated) to ``monitor/kept_adapter``;
- ``stop``: records the verdict, then raises :class:`MonitorStop`, which ends ``train.py`` at this eval (slime
  has no hook that ends its loop; the eval comes after the step's save and sync, so nothing is half-written).
  ``launch/stage.sh`` reads the verdict and reports the stage as stopped by the monitor, not failed.
Beside the scores it records RL's Razor's predictor where the stage's starting policy is servable
(:mod:`~aclarena_slime.slime_edge.policy_kl`: a LoRA stage's starting policy is the base model its engine
serves), the starting policy's log-probs scored by the same engine slime evaluated with (``sglang_router_ip``
/ ``sglang_router_port``); with full fine-tuning it says once that it cannot.
It prints one line per check to the job's log and returns False, so slime's own eval logging still runs
(slime 624b824 passes ``extra_metrics=None`` from its eval rollout, so the monitor's figures live in
``monitor.json``, not in wandb). ``run_dir`` must be on a filesystem the launcher's node reads (as
``lora.sync_dir``).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aclarena_slime.distill.mopd import TeacherAnswerError
from aclarena_slime.evaluation.monitor import KEPT_DIR, REPORT_FILE, ForgettingMonitor, MonitorError, MonitorSettings
from aclarena_slime.sglang_client import SGLangError
from aclarena_slime.slime_edge.policy_kl import FULL_FT_REASON, KlReference, domain_kl


class MonitorStop(RuntimeError):
    """The monitor's ``stop``: an earlier domain fell; the stage ends at this eval (the verdict is on disk)."""


@dataclass
class SlimeMonitor:
    """The custom config's ``aclarena_monitor`` section (written by the compiler) and the alarm's state."""

    monitor: ForgettingMonitor
    datasets: dict[str, str]  # eval dataset name -> the earlier domain it measures
    out_dir: Path
    policy_dir: Path | None  # the adapter the disk sync rewrites (what ``keep`` copies)
    temperatures: dict[str, float]  # eval dataset name -> the temperature its samples were drawn at
    kl_reference: KlReference | None  # where the starting policy is served; None: not servable (full FT)
    kl_note: str | None = None  # why the KL predictor is missing, once known

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> SlimeMonitor:
        values = dict(section)
        try:
            datasets = {str(k): str(v) for k, v in dict(values.pop("datasets")).items()}
            out_dir = Path(values.pop("out_dir"))
            policy_dir = values.pop("policy_dir", None)
            temperatures = {str(k): float(v) for k, v in dict(values.pop("temperatures", None) or {}).items()}
            reference = KlReference.from_section(values.pop("kl_reference", None))
        except (KeyError, TypeError, ValueError) as exc:
            raise MonitorError(
                f"aclarena_monitor needs datasets and out_dir, as the compiler writes them: {exc}"
            ) from None
        settings = MonitorSettings.from_mapping(values)
        policy = Path(policy_dir) if policy_dir else None
        return cls(ForgettingMonitor(settings), datasets, out_dir, policy, temperatures, reference)

    def policy_kl(self, data: Mapping[str, Any], engine_url: str | None) -> dict[str, float] | None:
        """Per earlier domain, KL(current ‖ starting policy) on this eval's samples; None where not computed
        (the reason printed once and kept for the report)."""
        if not self.monitor.settings.kl:
            return None
        if self.kl_reference is None or engine_url is None:
            if self.kl_note is None:
                self.kl_note = FULL_FT_REASON
                print(f"[monitor] {FULL_FT_REASON}", file=sys.stderr)
            return None
        by_domain: dict[str, list[float]] = {}
        try:
            for name, domain in self.datasets.items():
                samples = (data.get(name) or {}).get("samples") or []
                value = domain_kl(engine_url, self.kl_reference, samples, self.temperatures.get(name, 1.0))
                if not math.isnan(value):  # NaN: the dataset had no response token to count
                    by_domain.setdefault(domain, []).append(value)
        except (SGLangError, TeacherAnswerError) as exc:
            print(
                f"[monitor] KL predictor skipped at this check: the engine did not score the samples: {exc}",
                file=sys.stderr,
            )
            return None
        return {domain: sum(values) / len(values) for domain, values in by_domain.items()}

    def observe(self, step: int, data: Mapping[str, Any], kl: Mapping[str, float] | None = None) -> None:
        """Score the watched datasets of ``data``, run the alarm and act (``keep``); write the report."""
        by_domain: dict[str, list[float]] = {}
        for name, domain in self.datasets.items():
            rewards = (data.get(name) or {}).get("rewards")
            if not rewards:
                raise MonitorError(f"slime's eval results have no rewards for the monitored dataset {name!r}")
            by_domain.setdefault(domain, []).append(100.0 * sum(float(r) for r in rewards) / len(rewards))
        scores = {domain: sum(values) / len(values) for domain, values in by_domain.items()}
        alarms = self.monitor.observe(step, scores, kl)
        baselines = ", ".join(
            f"{d} {s:.1f} (start {self.monitor.baseline(d):.1f}"
            + (f", KL to the starting policy {kl[d]:.4g})" if kl and d in kl else ")")
            for d, s in scores.items()
        )
        print(f"[monitor] after {step} rollouts: {baselines}", file=sys.stderr)
        for alarm in alarms:
            print(f"[monitor] {alarm.message()}", file=sys.stderr)
        action = self.monitor.settings.action
        if action == "keep" and not self.monitor.alarms and self.policy_dir is not None:
            kept = self.out_dir / KEPT_DIR
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(self.policy_dir, kept)
        self.write()

    def report(self) -> dict[str, Any]:
        out = {**self.monitor.to_dict(), "domains": list(self.monitor.settings.domains), "backend": "slime"}
        if self.monitor.settings.action == "keep" and self.monitor.alarms:
            out["kept_adapter"] = str(self.out_dir / KEPT_DIR)
        if self.kl_note is not None:
            out["kl_note"] = self.kl_note
        return out

    def write(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.out_dir / f"{REPORT_FILE}.tmp"
        tmp.write_text(json.dumps(self.report(), indent=2))
        tmp.replace(self.out_dir / REPORT_FILE)


_RUNS: dict[str, SlimeMonitor] = {}  # one per stage (out_dir) in this RolloutManager process


def log_eval(rollout_id: int, args: Any, data: dict[str, Any], extra_metrics: dict[str, Any] | None = None) -> bool:
    """slime's ``--custom-eval-rollout-log-function-path``: the alarm on this eval; False lets slime log too."""
    section = getattr(args, "aclarena_monitor", None)
    if not isinstance(section, Mapping):
        raise MonitorError("the monitor's eval hook needs args.aclarena_monitor (the compiled custom config)")
    key = str(section.get("out_dir"))
    run = _RUNS.get(key)
    if run is None:
        run = _RUNS[key] = SlimeMonitor.from_section(section)
    # The monitor's step is the rollouts trained so far: train.py's eval after rollout r is step r + 1; its
    # first eval, before rollout 0 trains, also carries rollout_id 0 and is the baseline, step 0.
    before = run.monitor.last_step is None and rollout_id == 0 and not getattr(args, "skip_eval_before_train", False)
    # The engine slime evaluated with (its router) scores the starting policy for the KL predictor.
    engine_url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}" if run.kl_reference else None
    run.observe(0 if before else rollout_id + 1, data, run.policy_kl(data, engine_url))
    if run.monitor.should_stop:
        raise MonitorStop(
            f"forgetting monitor: stopping the stage at rollout {rollout_id} "
            f"({'; '.join(a.message() for a in run.monitor.alarms)}); report in {run.out_dir / REPORT_FILE}"
        )
    return False
