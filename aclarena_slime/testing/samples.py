"""A duck-typed stand-in for slime's ``Sample`` and ``args``, for tests that run without slime."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aclarena_slime.sample import Sample

# Slime's ``Sample`` stand-in for tests that run without slime.
FakeSample = Sample


def make_args(hf_checkpoint: str, host: str, port: int, **overrides: Any) -> SimpleNamespace:
    """A namespace with the slime arguments our rollout reads."""
    args = SimpleNamespace(
        hf_checkpoint=str(hf_checkpoint),
        sglang_router_ip=host,
        sglang_router_port=port,
        rollout_max_response_len=256,
        aclarena_env_config={},
        aclarena_experts=None,
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def make_slime_args(hf_checkpoint: str, host: str, port: int, **overrides: Any) -> SimpleNamespace:
    """:func:`make_args` plus what slime's own ``generate_and_rm`` reads, for tests against real slime."""
    slime_defaults: dict[str, Any] = dict(
        custom_generate_function_path="aclarena_slime.slime_edge.rollout.generate",
        custom_rm_path="aclarena_slime.slime_edge.rollout.reward",
        partial_rollout=False,
        mask_offpolicy_in_partial_rollout=False,
        group_rm=False,
        sglang_server_concurrency=4,
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        sglang_dp_size=None,
        rollout_temperature=1.0,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False,
        rollout_sample_hook_path=None,
        use_rollout_routing_replay=False,
        ci_test=False,
        rm_type=None,
        reward_key=None,
    )
    return make_args(hf_checkpoint, host, port, **{**slime_defaults, **overrides})


def check_invariants(sample: Any) -> None:
    """The token-level invariants every generated sample must satisfy (raises AssertionError)."""
    n = sample.response_length
    assert len(sample.loss_mask) == n, f"loss_mask has {len(sample.loss_mask)} entries, response_length is {n}"
    assert len(sample.rollout_log_probs) == n, f"{len(sample.rollout_log_probs)} log-probs for {n} response tokens"
    assert n <= len(sample.tokens), "response longer than the token list"
    assert all(m in (0, 1) for m in sample.loss_mask)


def mask_runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """The loss mask as ``(value, start, end)`` runs: which spans of a response are trained on."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs
