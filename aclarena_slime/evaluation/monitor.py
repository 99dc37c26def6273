"""The forgetting monitor inside a stage: earlier domains checked while the stage trains.

Local backend: :class:`StageMonitor` runs the earlier domains' datasets through the evaluation runner
(:func:`~aclarena_slime.evaluation.runner.run_suite`) against the stage's own engine, every request
served by the adapter being trained, and feeds the scores to the alarm
(:class:`~aclarena_slime.curriculum.monitor.ForgettingMonitor`). Slime: :func:`attach_monitor`
compiles the same datasets into the stage's ``--eval-config`` (slime runs them every
``--eval-interval`` rollouts and logs them; the alarm itself runs on the local backend only).

The local stage passes ``LocalStageConfig.monitor``: the :class:`MonitorSettings` fields plus
``domains`` (the earlier env tags, in training order); an empty mapping is no monitor.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from aclarena_slime.curriculum.monitor import ForgettingMonitor, MonitorSettings
from aclarena_slime.evaluation.suite import EvalDataset, EvalSuite, SuiteError, load_suite

KEPT_DIR = "kept_adapter"  # the policy of the last check before a fall (action "keep")


def monitor_suite(
    settings: MonitorSettings, domains: list[str], env_config: Mapping[str, Any] | None = None, slime: bool = False
) -> EvalSuite:
    """The datasets the monitor runs: the suite's datasets of ``domains``, or their demo records.

    ``slime``: the datasets' env settings are dropped (slime's eval config cannot carry them; the stage's
    ``aclarena_env_config`` applies), so only services their paths use need values.
    """
    env_config = env_config or {}
    if settings.suite:
        suite = load_suite(settings.suite, settings.services)
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
        values: Mapping[str, Any],
        url: str,
        served_name: str,
        model_dir: Path,
        adapter_name: str,
        adapter_dir: Path,
    ) -> None:
        from aclarena_slime.local.stage import bind_engine

        values = dict(values)
        self.domains = [str(d) for d in values.pop("domains", [])]
        self.monitor = ForgettingMonitor(MonitorSettings.from_mapping(values))
        env_config = bind_engine(self.monitor.settings.env_config, url, served_name)
        self.suite = monitor_suite(self.monitor.settings, self.domains, env_config)
        self.url, self.model_dir = url, model_dir
        self.adapter_name, self.adapter_dir = adapter_name, Path(adapter_dir)
        self.out = self.adapter_dir.parent / "monitor"
        self.seconds = 0.0
        self._tokenizer: Any = None

    @classmethod
    def for_stage(cls, cfg: Any, url: str, model_dir: Path, adapter_dir: Path) -> StageMonitor | None:
        """None when the stage has no monitor (disabled, or no earlier domain)."""
        values = dict(getattr(cfg, "monitor", None) or {})
        if not values.get("enabled") or not values.get("domains"):
            return None
        return cls(values, url, cfg.served_name, model_dir, cfg.expert_name, adapter_dir)

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
        experts = ExpertTable.from_mapping({tag: self.adapter_name for tag in self.domains})
        settings = RunSettings(out_dir=self.out / f"rollout_{step:05d}", stage=f"rollout {step}", concurrency=8)
        summary = await run_suite(self.suite, SGLangClient(self.url), self._tokenizer, settings, experts)
        alarms = self.monitor.observe(step, summary["domains"])
        for alarm in alarms:
            print(f"[monitor] {alarm.message()}", file=sys.stderr)
        if not alarms and not self.monitor.alarms and self.monitor.settings.action == "keep":
            kept = self.out / KEPT_DIR
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(self.adapter_dir, kept)
        self.seconds += time.monotonic() - started
        return self.monitor.should_stop

    def report(self, rollouts: int) -> dict[str, Any]:
        """The curves, alarms, the stage's length in rollouts and the seconds spent checking."""
        out = {**self.monitor.to_dict(), "domains": self.domains, "rollouts": rollouts, "seconds": round(self.seconds, 3)}
        if self.monitor.settings.action == "keep" and self.monitor.alarms:
            out["kept_adapter"] = str(self.out / KEPT_DIR)
        return out


def attach_monitor(
    recipe: Any, settings: MonitorSettings, domains: list[str], local: bool, earlier: Sequence[Any] = ()
) -> Any:
    """Give a stage recipe its monitor over ``domains`` (the earlier env tags); returns the recipe.

    Local: ``cluster.local.monitor``. Slime: an ``--eval-config`` beside the stage's outputs holding the
    stage's own eval datasets and the earlier domains', run every ``interval`` rollouts; the ``earlier``
    stage recipes lend their env settings and services, so slime's eval can run their envs.
    """
    domains = [d for d in dict.fromkeys(domains) if d and d != recipe.data.env]
    if not settings.enabled or not domains:
        return recipe
    if local:
        recipe.cluster.local["monitor"] = {**settings.to_dict(), "domains": domains}
        return recipe
    import yaml

    own = tuple(
        EvalDataset(name=name, env=recipe.data.env, path=path, max_response_len=recipe.rollout.rollout_max_response_len)
        for name, path in recipe.data.eval_prompt_data.items()
    )
    if not settings.suite:
        raise SuiteError("monitor.suite is required on the slime backend: its eval config reads data files")
    watched = monitor_suite(settings, domains, slime=True)
    from aclarena_slime.curriculum.replay import adopt_envs

    adopt_envs(recipe, [r for r in earlier if r.data.env in domains])
    from aclarena_slime.evaluation.slime_config import slime_eval_config

    config = slime_eval_config(EvalSuite("monitor", own + watched.datasets), recipe.paths.data)
    path = Path(recipe.run_dir) / "monitor_eval_config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    recipe.data.eval_prompt_data = {}  # slime reads --eval-config instead; the stage's own sets are in it
    recipe.extra["eval_config"] = str(path)
    recipe.extra["eval_interval"] = settings.interval
    return recipe
