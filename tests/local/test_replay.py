"""The replay baseline on the local backend: the mixture of the stage's records with the earlier domains'."""

from __future__ import annotations

from aclarena_slime.local.records import replay_mixture, replay_records
from aclarena_slime.testing.local import LEARNABLE, local_session


def test_replay_records_hold_the_share_in_every_step():
    own = [{"prompt": f"own {i}", "metadata": {"env": "c"}} for i in range(12)]
    earlier = {t: [{"prompt": f"{t} {i}", "metadata": {"env": t}} for i in range(12)] for t in ("a", "b")}
    values = {"enabled": True, "share": 0.5, "rule": "uniform", "current": "c", "domains": ["a", "b"]}
    records = replay_records(values, own, earlier, seed=0, per_step=4)
    assert len(records) == 12
    for step in range(3):
        tags = [r["metadata"]["env"] for r in records[4 * step : 4 * step + 4]]
        assert tags.count("c") == 2 and sorted(set(tags) - {"c"}) <= ["a", "b"]
    assert [r["metadata"]["env"] for r in records].count("a") == 3
    assert [r["prompt"] for r in records if r["metadata"]["env"] == "c"] == [f"own {i}" for i in range(6)]


def test_the_replay_mixture_mixes_real_env_records(tmp_path):
    ifeval = (*LEARNABLE, "data.env=ifeval", "+env_config.ifeval={}", "rollout.num_rollout=2",
              "rollout.rollout_batch_size=4", "++cluster.local.progress=false")  # fmt: skip
    session = local_session(
        tmp_path, *ifeval, "++custom.aclarena_replay={enabled: true, share: 0.5, current: ifeval, data: {math: unused}}"
    )
    own = [{"prompt": "p", "metadata": {"env": "ifeval"}}] * 8
    per_step = session.loop.sampling.prompts_per_step
    records = replay_mixture(session.records, own, {"ifeval": {}, "math": {}}, per_step)
    assert [r["metadata"]["env"] for r in records].count("math") == 4
    assert replay_mixture(local_session(tmp_path, *ifeval).records, own, {}, per_step) is own
