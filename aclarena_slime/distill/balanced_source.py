"""A domain-balanced data source for slime (``--data-source-path``): every batch draws equally from every domain.

A globally shuffled mixture lets the big domains drown the small one: in the authors' SDFT mixture
(if 225k, search 157k, math 156k, tau 19k records; WillDreamer/ACLArena
``slime/examples/SDFT/run_qwen3_8b_oracle_mix_sft_balance.sh``) a 128-record batch holds about four
tau records. Here each domain is its own shuffled bucket; a request for ``n`` prompts takes
``n // k`` from each of the ``k`` domains, the remainder going to the next domains in turn (so long
runs are exactly even), interleaved domain by domain. A bucket that runs out reshuffles and starts
over: small domains repeat within an epoch, by design. One epoch is one pass over the largest domain,
so ``len()`` is ``largest bucket × k`` and slime's ``--num-epoch`` keeps its meaning.

Slime reaches it through the ``balanced_data_source`` hook of :mod:`aclarena_slime.slime_edge`, which
builds the prompts with slime's own ``Dataset`` (exactly as slime builds them) and passes the run's
settings in. The domain of a record is ``metadata[balance_key]`` when that is set (a recipe's
``custom.aclarena_balance_key``), else ``metadata.domain``, else ``metadata.env`` (the env tag): SDFT
mixtures and mixed RL prompt streams both work.

Replay (the continual-learning baseline): a recipe's ``custom.aclarena_replay`` (:class:`ReplaySettings`,
set by the curriculum) gives the stage's own domain ``1 - share`` of every batch and the earlier domains
``share``, split by ``rule`` (``uniform``: equally; ``size``: by their record counts); the earlier
domains' prompts come from ``data`` (env tag -> their stages' prompt files). Unequal shares are drawn by
largest remainder over the running totals, so every domain stays within one record of its share.
"""

from __future__ import annotations

import copy
import json
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STATE_FILE = "rollout/aclarena_balanced_source_{rollout_id}.json"


REPLAY_RULES = ("uniform", "size")


@dataclass
class ReplaySettings:
    """The ``replay:`` section of a curriculum: how much of each batch replays earlier domains, and how."""

    enabled: bool = False
    share: float = 0.25  # of every batch, for the earlier domains together
    rule: str = "uniform"  # uniform | size: how ``share`` splits over the earlier domains
    # earlier domains (env tags) not replayed: the arena's retail, which cannot learn on a CPU (docs/arena.md)
    exclude: list[str] = field(default_factory=list)
    data: dict[str, str] = field(default_factory=dict)  # env tag -> prompt file (filled by the curriculum)
    current: str | None = None  # the stage's own domain (filled by the curriculum; else the first record's)
    # env tag -> how its own stage warm-started (the local backend's gold demos: ``demos``, the demo-turns
    # function; ``max_response_len``; ``min_reward``), filled by the curriculum: the local stage's warm start
    # replays them at the same share (slime's data source does not read it)
    warm_start: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"replay.share must be between 0 and 1 (exclusive), got {self.share!r}")
        if self.rule not in REPLAY_RULES:
            raise ValueError(f"replay.rule must be one of {', '.join(REPLAY_RULES)}, got {self.rule!r}")
        if isinstance(self.exclude, str) or not all(isinstance(t, str) and t for t in self.exclude):
            raise ValueError(f"replay.exclude must be a list of env tags, got {self.exclude!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def replay_weights(current: str, sizes: Mapping[str, int], share: float, rule: str = "uniform") -> dict[str, float]:
    """Each domain's share of a batch: ``current`` gets ``1 - share``, the others split ``share`` by ``rule``."""
    if current not in sizes:
        raise ValueError(f"the stage's own domain {current!r} has no records (domains: {', '.join(sorted(sizes))})")
    earlier = sorted(d for d in sizes if d != current)
    if not earlier:
        return {current: 1.0}
    total = sum(sizes[d] for d in earlier)
    split = {d: (sizes[d] / total if rule == "size" else 1 / len(earlier)) for d in earlier}
    return {current: 1.0 - share, **{d: share * split[d] for d in earlier}}


class DomainBalancer:
    """Index draws over per-domain buckets: equal shares (or ``weights``), reshuffle on exhaustion, resumable."""

    def __init__(
        self,
        buckets: Mapping[str, Sequence[int]],
        seed: int = 0,
        shuffle: bool = True,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        if not buckets or any(len(v) == 0 for v in buckets.values()):
            raise ValueError("every domain needs at least one record")
        if weights is not None and (set(weights) != set(buckets) or abs(sum(weights.values()) - 1.0) > 1e-9):
            raise ValueError(f"weights {dict(weights)} must cover the domains {sorted(buckets)} and sum to 1")
        self.weights = dict(weights) if weights is not None else None
        self.drawn = dict.fromkeys(buckets, 0)  # running totals (weighted draws)
        self.domains = sorted(buckets)  # fixed order: the draw sequence must not depend on file order
        self.buckets = {d: list(buckets[d]) for d in self.domains}
        self.seed, self.shuffle = seed, shuffle
        self.largest = max(self.domains, key=lambda d: (len(self.buckets[d]), d))
        self.epoch = 0  # passes over the largest domain
        self.cursor = 0  # which domain gets the next remainder slot
        self.bucket_epoch = dict.fromkeys(self.domains, 0)
        self.offset = dict.fromkeys(self.domains, 0)
        self.order = {d: self._ordered(d, 0) for d in self.domains}

    def __len__(self) -> int:
        return len(self.buckets[self.largest]) * len(self.domains)

    def _ordered(self, domain: str, epoch: int) -> list[int]:
        order = list(self.buckets[domain])
        if self.shuffle:
            # A string seed is hashed deterministically (unlike hash()), so a resumed run replays the order.
            random.Random(f"{self.seed}:{domain}:{epoch}").shuffle(order)
        return order

    def quotas(self, n: int) -> dict[str, int]:
        if self.weights is not None:
            return self._weighted_quotas(n)
        k = len(self.domains)
        share = dict.fromkeys(self.domains, n // k)
        for i in range(n % k):
            share[self.domains[(self.cursor + i) % k]] += 1
        return share

    def _weighted_quotas(self, n: int) -> dict[str, int]:
        """Largest remainder over the running totals: each domain within one draw of its share."""
        assert self.weights is not None
        total = sum(self.drawn.values()) + n
        target = {d: total * self.weights[d] - self.drawn[d] for d in self.domains}
        share = {d: max(0, int(target[d])) for d in self.domains}
        rest = sorted(self.domains, key=lambda d: (-(target[d] - share[d]), self.domains.index(d)))
        for d in rest[: max(0, n - sum(share.values()))]:
            share[d] += 1
        while sum(share.values()) > n:  # only when a domain was ahead of its share: trim the most ahead
            d = max((d for d in self.domains if share[d]), key=lambda d: share[d] - target[d])
            share[d] -= 1
        return share

    def draw(self, n: int) -> list[int]:
        """``n`` indices, equal (or weighted) shares per domain, interleaved (d1, d2, ..., d1, d2, ...)."""
        share = self.quotas(n)
        for d in self.domains:
            self.drawn[d] += share[d]
        self.cursor = (self.cursor + n % len(self.domains)) % len(self.domains)
        taken = {d: self._take(d, share[d]) for d in self.domains}
        out: list[int] = []
        for i in range(max(share.values(), default=0)):
            out += [taken[d][i] for d in self.domains if i < len(taken[d])]
        return out

    def _take(self, domain: str, k: int) -> list[int]:
        out: list[int] = []
        while k > 0:
            start = self.offset[domain]
            chunk = self.order[domain][start : start + k]
            out += chunk
            self.offset[domain] = start + len(chunk)
            k -= len(chunk)
            if k > 0 or self.offset[domain] == len(self.order[domain]):
                self.bucket_epoch[domain] += 1
                self.order[domain] = self._ordered(domain, self.bucket_epoch[domain])
                self.offset[domain] = 0
                if domain == self.largest:
                    self.epoch = self.bucket_epoch[domain]
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "sizes": {d: len(self.buckets[d]) for d in self.domains},
            "bucket_epoch": dict(self.bucket_epoch),
            "offset": dict(self.offset),
            "drawn": dict(self.drawn),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        sizes = {d: len(self.buckets[d]) for d in self.domains}
        if dict(state.get("sizes", {})) != sizes:
            raise ValueError(f"saved balancer state is for domains {state.get('sizes')}, the data has {sizes}")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self.drawn = {d: int((state.get("drawn") or {}).get(d, 0)) for d in self.domains}
        for d in self.domains:
            self.bucket_epoch[d] = int(state["bucket_epoch"][d])
            self.offset[d] = int(state["offset"][d])
            self.order[d] = self._ordered(d, self.bucket_epoch[d])


def domain_of(metadata: Any, key: str | None = None) -> str | None:
    metadata = metadata if isinstance(metadata, Mapping) else {}
    value = metadata.get(key) if key else (metadata.get("domain") or metadata.get("env"))
    return str(value) if value else None


class BalancedSource:
    """Slime's ``DataSource`` interface (``get_samples``, ``add_samples``, ``save``, ``load``, ``__len__``)
    over prompt samples already built; ``save_dir`` / ``load_dir`` are slime's ``--save`` / ``--load``."""

    def __init__(
        self,
        samples: Sequence[Any],
        *,
        samples_per_prompt: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        balance_key: str | None = None,
        replay: ReplaySettings | None = None,
        save_dir: str | None = None,
        load_dir: str | None = None,
        source_name: str = "the data",
    ) -> None:
        self.samples = list(samples)
        self.samples_per_prompt = int(samples_per_prompt or 1)
        self.save_dir, self.load_dir = save_dir, load_dir
        buckets: dict[str, list[int]] = {}
        for index, sample in enumerate(self.samples):
            domain = domain_of(sample.metadata, balance_key)
            if domain is None:
                wanted = f"metadata.{balance_key}" if balance_key else "metadata.domain or metadata.env"
                raise ValueError(f"record {index} of {source_name} has no {wanted}")
            buckets.setdefault(domain, []).append(index)
        if not buckets:
            raise ValueError(f"no records in {source_name}")
        weights = None
        if replay is not None:
            current = replay.current or domain_of(self.samples[0].metadata, balance_key)
            weights = replay_weights(current, {d: len(v) for d, v in buckets.items()}, replay.share, replay.rule)
        self.balancer = DomainBalancer(buckets, seed=seed, shuffle=shuffle, weights=weights)
        self.buffer: list[list[Any]] = []
        self.sample_group_index = 0
        self.sample_index = 0
        log.info("balanced data source: %s", {d: len(v) for d, v in sorted(buckets.items())})

    def __len__(self) -> int:
        return len(self.balancer)

    @property
    def epoch_id(self) -> int:
        return self.balancer.epoch

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        """``num_samples`` groups of ``n_samples_per_prompt`` copies; buffered (aborted) groups first."""
        groups = self.buffer[:num_samples]
        del self.buffer[: len(groups)]
        for index in self.balancer.draw(num_samples - len(groups)):
            group = []
            for _ in range(self.samples_per_prompt):
                sample = copy.deepcopy(self.samples[index])
                sample.group_index, sample.index = self.sample_group_index, self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            groups.append(group)
        return groups

    def add_samples(self, samples: list[list[Any]]) -> None:
        """Take back groups slime could not finish (partial rollout); they are served first."""
        for group in samples or []:
            if not isinstance(group, list):
                raise TypeError(f"add_samples takes groups (lists of samples), got {type(group).__name__}")
            self.buffer.append(group)

    def save(self, rollout_id: int) -> None:
        if not self.save_dir:
            return
        path = Path(self.save_dir) / STATE_FILE.format(rollout_id=rollout_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "balancer": self.balancer.state_dict(),
            "sample_group_index": self.sample_group_index,
            "sample_index": self.sample_index,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(path)

    def load(self, rollout_id: int | None = None) -> None:
        if not self.load_dir or rollout_id is None:
            return
        path = Path(self.load_dir) / STATE_FILE.format(rollout_id=rollout_id)
        if not path.exists():
            log.info("no balanced data source state at %s; starting from the beginning", path)
            return
        state = json.loads(path.read_text())
        self.balancer.load_state_dict(state["balancer"])
        self.sample_group_index = int(state["sample_group_index"])
        self.sample_index = int(state["sample_index"])
