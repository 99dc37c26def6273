"""The domain-balanced data source: per-batch domain shares, cycling, groups, resume, buffer."""

from __future__ import annotations

from collections import Counter

import pytest

from aclarena_slime.distill.balanced_source import BalancedSource, DomainBalancer, ReplaySettings
from aclarena_slime.distill.dumps import episode_from_record
from aclarena_slime.distill.sdft import MixtureSettings, build_mixture
from aclarena_slime.testing.samples import FakeSample

SIZES = {"math": 40, "search": 13, "tau": 3}


def _source(samples, tmp_path=None, **kw) -> BalancedSource:
    """The source as slime's run would set it up (seed 7, shuffled), resuming from ``tmp_path`` when given."""
    if isinstance(kw.get("replay"), dict):
        kw["replay"] = ReplaySettings(**kw["replay"])
    folder = str(tmp_path) if tmp_path is not None else None
    return BalancedSource(samples, seed=7, shuffle=True, save_dir=folder, load_dir=folder, **kw)


def _mixture_samples(make_sample):
    """The pipeline's output, loaded the way slime's Dataset does: prompt = messages, metadata kept."""
    episodes = [
        episode_from_record(make_sample(domain, f"{domain} question {i}", f"answer {i}", 1.0), f"{domain}:{i}")
        for domain, n in SIZES.items()
        for i in range(n)
    ]
    records, _ = build_mixture(episodes, MixtureSettings(default_threshold=1.0))
    assert len(records) == sum(SIZES.values())
    return [FakeSample(prompt=r["messages"], metadata=dict(r["metadata"])) for r in records]


def _domains(groups):
    return [group[0].metadata["domain"] for group in groups]


def test_every_batch_draws_equally_from_every_domain(make_sample):
    source = _source(_mixture_samples(make_sample))
    assert len(source) == 40 * 3  # one epoch = one pass over the largest domain
    for _ in range(10):
        batch = _domains(source.get_samples(12))
        assert Counter(batch) == {"math": 4, "search": 4, "tau": 4}
        assert batch[:3] == ["math", "search", "tau"]  # interleaved, not blocks


def test_remainders_rotate_so_long_runs_are_even(make_sample):
    source = _source(_mixture_samples(make_sample))
    shares = [Counter(_domains(source.get_samples(10))) for _ in range(3)]
    for share in shares:
        assert sorted(share.values()) == [3, 3, 4]
    assert sum(shares, Counter()) == {"math": 10, "search": 10, "tau": 10}


def test_small_domains_cycle_through_every_record_before_repeating(make_sample):
    source = _source(_mixture_samples(make_sample))
    tau = [g[0].prompt[0]["content"] for g in source.get_samples(30) if g[0].metadata["domain"] == "tau"]
    assert len(tau) == 10
    for start in (0, 3, 6):
        assert len(set(tau[start : start + 3])) == 3  # each pass is a permutation of the 3 records
    assert source.epoch_id == 0
    source.get_samples(3 * 30)  # math has seen 10 + 30 = 40 records: one full pass
    assert source.epoch_id == 1


def test_groups_are_independent_copies_with_running_indices(make_sample):
    source = _source(_mixture_samples(make_sample), samples_per_prompt=4)
    groups = source.get_samples(3)
    assert [len(g) for g in groups] == [4, 4, 4]
    assert [s.index for g in groups for s in g] == list(range(12))
    assert [g[0].group_index for g in groups] == [0, 1, 2]
    groups[0][0].metadata["touched"] = True
    assert "touched" not in groups[0][1].metadata and "touched" not in source.samples[0].metadata
    assert groups[0][0].prompt == groups[0][3].prompt


def test_save_and_load_resume_the_exact_sequence(tmp_path, make_sample):
    samples = _mixture_samples(make_sample)
    first = _source(samples, tmp_path)
    for _ in range(7):
        first.get_samples(10)
    first.save(6)
    expected = [[s.prompt[0]["content"] for g in first.get_samples(10) for s in g] for _ in range(3)]

    resumed = _source(samples, tmp_path)
    resumed.load(6)
    got = [[s.prompt[0]["content"] for g in resumed.get_samples(10) for s in g] for _ in range(3)]
    assert got == expected
    assert resumed.sample_index == first.sample_index

    fresh = _source(samples, tmp_path)
    fresh.load(99)  # no state saved for that rollout: starts from the beginning
    assert fresh.sample_index == 0
    changed = _source(samples[:-1], tmp_path)
    with pytest.raises(ValueError, match="saved balancer state is for domains"):
        changed.load(6)


def test_buffered_groups_come_first(make_sample):
    source = _source(_mixture_samples(make_sample))
    aborted = source.get_samples(2)
    source.add_samples(aborted)
    again = source.get_samples(5)
    assert again[:2] == aborted and len(again) == 5
    with pytest.raises(TypeError, match="groups"):
        source.add_samples([FakeSample()])


def test_domain_key_falls_back_to_env_tag_and_missing_tags_are_errors():
    prompts = [FakeSample(prompt=f"p{i}", metadata={"env": "math" if i % 2 else "search"}) for i in range(6)]
    source = _source(prompts)
    assert Counter(_domains_env(source.get_samples(4))) == {"math": 2, "search": 2}
    keyed = [FakeSample(prompt="p", metadata={"data_source": "if", "env": "ifeval"})]
    assert _domains_env(_source(keyed, balance_key="data_source").get_samples(1))
    with pytest.raises(ValueError, match="record 1 of .* has no metadata.domain or metadata.env"):
        _source([prompts[0], FakeSample(prompt="x", metadata={})])
    with pytest.raises(ValueError, match="no metadata.data_source"):
        _source(prompts, balance_key="data_source")


def _domains_env(groups):
    return [group[0].metadata["env"] for group in groups]


def test_unshuffled_balancer_is_deterministic_round_robin():
    balancer = DomainBalancer({"a": [0, 1], "b": [2, 3, 4]}, shuffle=False)
    assert balancer.draw(4) == [0, 2, 1, 3]
    assert balancer.draw(4) == [0, 4, 1, 2]  # a wrapped around; b continues
    with pytest.raises(ValueError, match="at least one record"):
        DomainBalancer({"a": []})


def test_replay_weights_split_the_share_over_earlier_domains():
    from aclarena_slime.distill.balanced_source import replay_weights

    assert replay_weights("c", {"c": 10, "a": 30, "b": 10}, 0.2) == pytest.approx({"c": 0.8, "a": 0.1, "b": 0.1})
    assert replay_weights("c", {"c": 10, "a": 30, "b": 10}, 0.2, "size") == pytest.approx(
        {"c": 0.8, "a": 0.15, "b": 0.05}
    )
    assert replay_weights("c", {"c": 5}, 0.3) == {"c": 1.0}  # the first stage: nothing to replay
    with pytest.raises(ValueError, match="own domain 'x'"):
        replay_weights("x", {"c": 5}, 0.3)


def test_replay_source_keeps_each_domain_within_one_record_of_its_share(make_sample):
    replay = {"enabled": True, "share": 0.25, "rule": "uniform", "current": "math"}
    source = _source(_mixture_samples(make_sample), replay=replay)
    totals: Counter = Counter()
    for n in (7, 8, 5, 12, 9, 3, 16):
        totals += Counter(_domains(source.get_samples(n)))
        drawn = sum(totals.values())
        expected = {"math": 0.75 * drawn, "search": 0.125 * drawn, "tau": 0.125 * drawn}
        assert all(abs(totals[d] - expected[d]) < 1 for d in expected), (totals, drawn)
    assert totals["math"] == 45  # 60 drawn: 3/4 of every batch from the stage's own domain


def test_replay_draws_resume_exactly(tmp_path, make_sample):
    replay = {"enabled": True, "share": 0.4, "rule": "size", "current": "search"}
    samples = _mixture_samples(make_sample)
    first = _source(samples, tmp_path, replay=replay)
    first.get_samples(11)
    first.save(3)
    expected = _domains(first.get_samples(13))
    second = _source(samples, tmp_path, replay=replay)
    second.load(3)
    assert _domains(second.get_samples(13)) == expected


def test_bad_replay_settings_are_named():
    from aclarena_slime.distill.balanced_source import ReplaySettings

    with pytest.raises(ValueError, match="replay.share"):
        ReplaySettings(share=1.0)
    with pytest.raises(ValueError, match="replay.rule"):
        ReplaySettings(rule="recent")
