"""Slime's own dynamic-sampling loop (``slime/rollout/sglang_rollout.py`` ``generate_rollout_async``) with our
generate hook and group filter, against a model that never searches: the issue-44 spin (over 15 minutes,
6,500 engine requests without one rollout). The filter's refill bound ends it with a named error.
Runs where slime is importable."""

from __future__ import annotations

import asyncio

import pytest

from aclarena_slime.rollout_guard import RefillExhausted
from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.samples import make_slime_args

pytestmark = pytest.mark.slime


async def test_slimes_refill_loop_ends_when_our_filter_drops_every_group(tiny_checkpoint, tiny_tokenizer):
    from slime.rollout import sglang_rollout
    from slime.utils.misc import SingletonMeta
    from slime.utils.types import Sample

    SingletonMeta._instances.pop(sglang_rollout.GenerateState, None)  # slime's state is per process: this run's

    drawn = 0

    def data_source(n):
        nonlocal drawn
        groups = []
        for _ in range(n):
            groups.append([Sample(prompt=f"Where is the Eiffel tower? ({drawn})", label="Paris", index=drawn * 2 + k,
                                  group_index=drawn, metadata={"env": "search"}) for k in range(2)])  # fmt: skip
            drawn += 1
        return groups

    async with FakeSGLang(tiny_tokenizer, ["<answer>Paris</answer>"]) as engine:  # never calls the search tool
        args = make_slime_args(
            tiny_checkpoint, engine.host, engine.port, rollout_global_dataset=True, rollout_batch_size=2,
            n_samples_per_prompt=2, over_sampling_batch_size=2, rollout_max_response_len=16,
            dynamic_sampling_filter_path="aclarena_slime.slime_edge.rollout.drop_no_tool",
            rollout_sample_filter_path=None, rollout_all_samples_process_path=None,
            sglang_enable_deterministic_inference=False,
            aclarena_env_config={"search": {"topk": 1, "protocol": "tool_call", "reward": "shaped_effective"}},
        )  # fmt: skip
        try:
            with pytest.raises(RefillExhausted, match=r"dropped 20 groups in a row \(all_no_tool 20\), 10 rounds of 2"):
                await asyncio.wait_for(sglang_rollout.generate_rollout_async(args, 0, data_source), timeout=120)
        finally:
            SingletonMeta._instances.pop(sglang_rollout.GenerateState, None)
    assert drawn == 20 and len(engine.requests) == 40
