"""The forgetting monitor: its settings (the recipe's ``monitor:`` section), its alarm, and the local check.

While stage k trains, every ``interval`` rollouts, every earlier domain (``domains``) is evaluated. The
first score of a domain in the stage is its baseline (the policy the stage started from); a domain whose
score falls more than ``max_drop`` points below that baseline raises an alarm, once per domain.
``action`` says what the stage does then: ``warn`` (log and metrics only), ``keep`` (also keep the policy
of the last check before the fall) or ``stop`` (end the stage there).

Beside the scores, ``kl`` records the predictor RL's Razor reports (Shenfeld et al. 2025: forgetting
tracks the KL divergence of the fine-tuned policy from the one it started from, measured on the earlier
tasks' inputs): per earlier domain, the mean per-token KL(current || the stage's starting policy) on the
responses the current policy gave to that domain's prompts. It needs no reward and moves before the
scores do, so it is the cheap early signal; the alarm itself stays on the scores.

:class:`ForgettingMonitor` is the alarm (plain logic, no I/O). Both backends drive it:
- local: :class:`StageMonitor` runs the earlier domains' datasets through the evaluation runner
  (:func:`~aclarena_slime.evaluation.runner.run_suite`) against the stage's engine, every request served by
  the policy being trained, and computes the KL exactly (over the vocabulary) with both policies in process;
- slime: the compiler writes :func:`monitor_suite`'s datasets into the stage's ``--eval-config`` and the
  hook :mod:`aclarena_slime.slime_edge.monitor` feeds slime's eval results to the same alarm.
The curriculum writes the section (:func:`aclarena_slime.curriculum.sections.attach_monitor`).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from aclarena_slime.evaluation.suite import (
    HELD_OUT_DEMOS,
    EvalDataset,
    EvalSuite,
    StageReader,
    SuiteError,
    load_suite,
)

ACTIONS = ("warn", "keep", "stop")
KEPT_DIR = "kept_adapter"  # the policy of the last check before a fall (action "keep")
REFERENCE_DIR = "reference_policy"  # the stage's starting policy, the KL's reference (local backend)
REPORT_FILE = "monitor.json"  # the curves, alarms and verdict, rewritten at every check


class MonitorError(ValueError):
    """A monitor setting that cannot work; the message names it."""


@dataclass
class MonitorSettings:
    """The ``monitor:`` section of a curriculum, and of a stage recipe (the curriculum fills ``domains``)."""

    enabled: bool = False
    domains: list[str] = field(default_factory=list)  # the earlier env tags checked (a stage's; empty: none)
    interval: int = 1  # rollouts between two checks (slime: --eval-interval)
    max_drop: float = 5.0  # accuracy points below the stage's starting score that raise the alarm
    action: str = "warn"  # warn | keep | stop
    # Eval suite with the earlier domains' datasets (relative to the curriculum file). None: each earlier
    # env's generated demo records (``demo_size`` of them) — the local backend only; slime needs data files.
    suite: str | None = None
    services: dict[str, str] = field(default_factory=dict)  # the suite's ``services`` (e.g. retriever_url)
    demo_size: int = 8
    max_response_len: int = 64  # token budget of a demo-record check
    # env tag -> settings merged over each checked dataset's env settings; ``{local_engine}`` and
    # ``{local_model}`` name the stage's engine (e.g. a user simulator served by it)
    env_config: dict[str, Any] = field(default_factory=dict)
    kl: bool = True  # also record the KL to the stage's starting policy on the earlier domains (RL's Razor)

    def __post_init__(self) -> None:
        if not isinstance(self.interval, int) or isinstance(self.interval, bool) or self.interval < 1:
            raise MonitorError(f"monitor.interval must be a positive integer, got {self.interval!r}")
        if self.max_drop < 0:
            raise MonitorError(f"monitor.max_drop must be >= 0 (accuracy points), got {self.max_drop!r}")
        if self.action not in ACTIONS:
            raise MonitorError(f"monitor.action must be one of {', '.join(ACTIONS)}, got {self.action!r}")
        if self.demo_size < 1 or self.max_response_len < 1:
            raise MonitorError("monitor.demo_size and monitor.max_response_len must be positive")
        if self.demo_size > HELD_OUT_DEMOS:  # beyond them, a stage may have trained on the prompts checked
            raise MonitorError(
                f"monitor.demo_size is at most {HELD_OUT_DEMOS} (the held-out demo records no local stage trains "
                f"on), got {self.demo_size}; give a suite of data files for a larger check"
            )
        if not all(isinstance(d, str) and d for d in self.domains):
            raise MonitorError(f"monitor.domains must be env tags, got {list(self.domains)!r}")

    @property
    def active(self) -> bool:
        """Whether a stage runs the monitor: enabled, with an earlier domain to watch."""
        return self.enabled and bool(self.domains)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> MonitorSettings:
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise MonitorError(f"unknown monitor settings: {', '.join(unknown)}")
        return cls(**dict(values))


@dataclass(frozen=True)
class Alarm:
    domain: str
    step: int  # the rollout after which the fall was seen
    baseline: float
    score: float
    kept_step: int | None  # the last check before the fall (the policy ``keep`` saves)

    @property
    def drop(self) -> float:
        return self.baseline - self.score

    def message(self) -> str:
        return (
            f"forgetting alarm: {self.domain} fell {self.drop:.1f} points "
            f"({self.baseline:.1f} -> {self.score:.1f}) by rollout {self.step}"
        )


@dataclass
class ForgettingMonitor:
    """Per-domain curves of one stage and the alarms raised on them."""

    settings: MonitorSettings
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    alarms: list[Alarm] = field(default_factory=list)
    kl: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # domain -> KL to the starting policy
    last_quiet_step: int | None = None  # the last check at which no domain had fallen
    last_step: int | None = None

    def due(self, step: int) -> bool:
        """Check after rollout ``step`` (0 = before the first one: the baseline)."""
        return step % self.settings.interval == 0

    def baseline(self, domain: str) -> float | None:
        curve = self.curves.get(domain)
        return curve[0][1] if curve else None

    def observe(self, step: int, scores: Mapping[str, float], kl: Mapping[str, float] | None = None) -> list[Alarm]:
        """Record ``scores`` (domain -> accuracy in points) and ``kl`` (domain -> KL to the starting policy)
        seen after rollout ``step``; return the new alarms."""
        if self.last_step is not None and step <= self.last_step:
            raise MonitorError(f"monitor steps must increase; got {step} after {self.last_step}")
        self.last_step = step
        for domain, value in (kl or {}).items():
            self.kl.setdefault(domain, []).append((step, float(value)))
        new: list[Alarm] = []
        fallen = {a.domain for a in self.alarms}
        for domain, score in scores.items():
            curve = self.curves.setdefault(domain, [])
            curve.append((step, float(score)))
            base = curve[0][1]
            if domain not in fallen and base - float(score) > self.settings.max_drop:
                new.append(Alarm(domain, step, base, float(score), self.last_quiet_step))
        if not new and not fallen:
            self.last_quiet_step = step
        self.alarms += new
        return new

    @property
    def should_stop(self) -> bool:
        return self.settings.action == "stop" and bool(self.alarms)

    def to_dict(self) -> dict[str, Any]:
        """What goes into the stage's metrics (and the curriculum manifest, for the report's plot)."""
        return {
            "settings": self.settings.to_dict(),
            "curves": {d: [[s, v] for s, v in c] for d, c in self.curves.items()},
            "kl": {d: [[s, v] for s, v in c] for d, c in self.kl.items()},
            "alarms": [{**asdict(a), "drop": round(a.drop, 3)} for a in self.alarms],
            "stopped": self.should_stop,
        }


def monitor_suite(settings: MonitorSettings, slime: bool = False, stages: StageReader | None = None) -> EvalSuite:
    """The datasets the monitor runs: the suite's datasets of ``settings.domains``, or their demo records.

    ``slime``: a suite is required (slime's eval reads data files) and the datasets' env settings are
    dropped (slime's eval config cannot carry them; the stage's ``aclarena_env_config`` applies), so only
    services their paths use need values. ``stages`` binds a dataset that names a stage (the recipes layer's
    :func:`aclarena_slime.recipes.compiler.read_stage`).
    """
    domains, env_config = settings.domains, {} if slime else settings.env_config
    if slime and not settings.suite:
        raise SuiteError("monitor.suite is required on the slime backend: its eval config reads data files")
    if settings.suite:
        suite = load_suite(settings.suite, settings.services, stages)
        datasets = tuple(d for d in suite.datasets if d.domain in domains)  # a domain is its env tag by default
        if slime:
            datasets = tuple(replace(d, env_config={}) for d in datasets)
        suite = EvalSuite(suite.name, datasets).require_services()  # only the watched datasets need theirs
        missing = [t for t in domains if not any(d.domain == t for d in datasets)]
        if missing:
            raise SuiteError(f"monitor suite {settings.suite} has no dataset for the earlier domain(s) {missing}")
    else:
        datasets = tuple(
            EvalDataset(
                name=tag, env=tag, demo=settings.demo_size, temperature=0.0, max_response_len=settings.max_response_len
            )
            for tag in domains
        )
    datasets = tuple(replace(d, env_config={**d.env_config, **dict(env_config.get(d.env) or {})}) for d in datasets)
    return EvalSuite(name="monitor", datasets=datasets)


class StageMonitor:
    """Checks the earlier domains of a local stage; ``check`` after every rollout, true when to stop."""

    def __init__(
        self,
        settings: MonitorSettings,
        url: str,
        model_dir: Path,
        adapter_name: str | None,
        policy_dir: Path,
        stages: StageReader | None = None,
    ) -> None:
        """``settings``' env settings are bound to the engine at ``url`` already (the backend fills their
        placeholders); ``policy_dir`` is the policy being trained (a PEFT folder, or with ``adapter_name``
        None the fully fine-tuned model folder); ``stages`` binds a suite's stage-bound datasets
        (:func:`monitor_suite`)."""
        self.monitor = ForgettingMonitor(settings)
        self.domains = list(settings.domains)
        self.suite = monitor_suite(settings, stages=stages)
        self.url, self.model_dir = url, model_dir
        self.adapter_name, self.policy_dir = adapter_name, Path(policy_dir)
        self.out = self.policy_dir.parent / "monitor"
        self.seconds = 0.0
        self._tokenizer: Any = None

    @classmethod
    def for_stage(
        cls,
        values: Mapping[str, Any],
        url: str,
        model_dir: Path,
        adapter_name: str | None,
        policy_dir: Path,
        stages: StageReader | None = None,
    ) -> StageMonitor | None:
        """None when the stage has no monitor (disabled, or no earlier domain); ``values``: the settings' fields."""
        settings = MonitorSettings.from_mapping(values)
        return cls(settings, url, model_dir, adapter_name, policy_dir, stages) if settings.active else None

    @property
    def keeps_policy(self) -> bool:
        """Whether the monitor reads the policy folder at its checks (``keep`` copies it, ``kl`` scores it):
        with full fine-tuning the runner must write it before each check."""
        return self.monitor.settings.action == "keep" or self.monitor.settings.kl

    async def check(self, step: int) -> bool:
        """Evaluate the earlier domains after rollout ``step`` when due; true when the stage should stop."""
        if not self.monitor.due(step):
            return False
        from aclarena_slime.evaluation.runner import RunSettings, run_suite
        from aclarena_slime.experts import ExpertTable
        from aclarena_slime.sglang_client import SGLangClient

        started = time.monotonic()
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        experts = (  # None: the engine's own weights are the policy (full fine-tuning)
            ExpertTable.from_mapping({tag: self.adapter_name for tag in self.domains}) if self.adapter_name else None
        )
        settings = RunSettings(out_dir=self.out / f"rollout_{step:05d}", stage=f"rollout {step}", concurrency=8)
        summary = await run_suite(self.suite, SGLangClient(self.url), self._tokenizer, settings, experts)
        kl = None
        if self.monitor.settings.kl:
            reference = self.out / REFERENCE_DIR
            if self.monitor.last_step is None:  # the first check: the policy the stage starts from
                _copy_policy(self.policy_dir, reference)
            kl = policy_kl(self.model_dir, self.policy_dir, reference, self.adapter_name is not None,
                           _episodes(settings.out_dir))  # fmt: skip
        alarms = self.monitor.observe(step, summary["domains"], kl)
        for alarm in alarms:
            print(f"[monitor] {alarm.message()}", file=sys.stderr)
        if not alarms and not self.monitor.alarms and self.monitor.settings.action == "keep":
            _copy_policy(self.policy_dir, self.out / KEPT_DIR)
        self.seconds += time.monotonic() - started
        return self.monitor.should_stop

    def report(self, rollouts: int) -> dict[str, Any]:
        """The curves, alarms, the stage's length in rollouts and the seconds spent checking."""
        out = {
            **self.monitor.to_dict(),
            "domains": self.domains,
            "rollouts": rollouts,
            "seconds": round(self.seconds, 3),
        }
        if self.monitor.settings.action == "keep" and self.monitor.alarms:
            out["kept_adapter"] = str(self.out / KEPT_DIR)
        return out


def _copy_policy(source: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)


def _episodes(run_dir: Path) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Domain -> (prompt + response token ids, response loss mask) of each episode an eval run wrote."""
    out: dict[str, list[tuple[list[int], list[int]]]] = {}
    for path in sorted((run_dir / "samples").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("response_ids"):
                out.setdefault(row["domain"], []).append(
                    (list(row["prompt_ids"]) + list(row["response_ids"]), list(row["loss_mask"]))
                )
    return out


def policy_kl(
    model_dir: Path,
    current: Path,
    reference: Path,
    adapters: bool,
    episodes: Mapping[str, list[tuple[list[int], list[int]]]],
) -> dict[str, float]:
    """Per domain, the mean over model-written response tokens of KL(current || reference), exact over the
    vocabulary at each position; the prefixes are the current policy's own episodes (RL's Razor's measure).

    ``adapters``: ``current`` and ``reference`` are PEFT folders on ``model_dir``; else model folders.
    """
    import torch
    from transformers import AutoModelForCausalLM

    def load(path: Path, adapter: bool) -> Any:
        if not adapter:
            return AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32).eval()
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
        return PeftModel.from_pretrained(base, str(path)).eval()

    policy, anchor = load(current, adapters), load(reference, adapters)
    out: dict[str, float] = {}
    with torch.no_grad():
        for domain, rows in episodes.items():
            total, count = 0.0, 0
            for ids, mask in rows:
                tokens = torch.tensor([ids])
                start = len(ids) - len(mask)  # the logits at position i predict token i + 1
                logp = torch.log_softmax(policy(tokens).logits[0, start - 1 : -1].float(), -1)
                logq = torch.log_softmax(anchor(tokens).logits[0, start - 1 : -1].float(), -1)
                per_token = (logp.exp() * (logp - logq)).sum(-1)
                chosen = torch.tensor(mask, dtype=torch.bool)
                total += float(per_token[chosen].sum())
                count += int(chosen.sum())
            if count:
                out[domain] = total / count
    return out
