"""The forgetting monitor's alarm: fires on a fall of more than ``max_drop`` points, quiet otherwise."""

from __future__ import annotations

import pytest

from aclarena_slime.evaluation.monitor import ForgettingMonitor, MonitorError, MonitorSettings


def run(scores_by_step: dict[int, dict[str, float]], **settings) -> ForgettingMonitor:
    monitor = ForgettingMonitor(MonitorSettings(enabled=True, **settings))
    for step, scores in scores_by_step.items():
        monitor.observe(step, scores)
    return monitor


def test_alarm_fires_when_a_domain_falls_below_its_start():
    monitor = run({0: {"a": 60.0, "b": 40.0}, 2: {"a": 58.0, "b": 41.0}, 4: {"a": 50.0, "b": 39.0}}, max_drop=5.0)
    (alarm,) = monitor.alarms
    assert (alarm.domain, alarm.step, alarm.baseline, alarm.score) == ("a", 4, 60.0, 50.0)
    assert alarm.drop == pytest.approx(10.0) and alarm.kept_step == 2  # the last check before the fall
    assert "a fell 10.0 points" in alarm.message()
    assert monitor.to_dict()["curves"]["a"] == [[0, 60.0], [2, 58.0], [4, 50.0]]
    assert not monitor.should_stop  # action warn


def test_alarm_stays_quiet_within_the_allowed_drop_and_on_gains():
    monitor = run({0: {"a": 60.0, "b": 10.0}, 1: {"a": 55.0, "b": 30.0}, 2: {"a": 56.0, "b": 5.5}}, max_drop=5.0)
    assert monitor.alarms == [] and monitor.last_quiet_step == 2


def test_each_domain_alarms_once_and_stop_asks_the_stage_to_end():
    monitor = ForgettingMonitor(MonitorSettings(enabled=True, max_drop=1.0, action="stop"))
    assert monitor.observe(0, {"a": 50.0}) == []
    assert [a.domain for a in monitor.observe(1, {"a": 40.0})] == ["a"]
    assert monitor.observe(2, {"a": 30.0}) == []  # still fallen: no second alarm
    assert monitor.should_stop and monitor.to_dict()["stopped"]


def test_checks_are_due_every_interval_and_steps_must_increase():
    monitor = ForgettingMonitor(MonitorSettings(enabled=True, interval=3))
    assert [s for s in range(8) if monitor.due(s)] == [0, 3, 6]
    monitor.observe(3, {"a": 1.0})
    with pytest.raises(MonitorError, match="increase"):
        monitor.observe(3, {"a": 1.0})


@pytest.mark.parametrize(
    "values, match",
    [({"interval": 0}, "interval"), ({"max_drop": -1}, "max_drop"), ({"action": "panic"}, "action")],
)
def test_bad_settings_are_named(values, match):
    with pytest.raises(MonitorError, match=match):
        MonitorSettings(**values)
    with pytest.raises(MonitorError, match="unknown monitor settings: typo"):
        MonitorSettings.from_mapping({"typo": 1})
