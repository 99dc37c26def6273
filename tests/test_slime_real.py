"""The slime-facing functions against real slime (runs where slime is importable; CI has no slime).

Slime's own loader finds them by dotted path, and slime's own ``generate_and_rm`` drives them with
its real ``Sample``: a one-turn math sample and a two-turn sample keep the token invariants.
"""

from __future__ import annotations

import pytest

from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.samples import check_invariants, make_args

pytestmark = pytest.mark.slime


def _slime_args(ckpt, engine):
    return make_args(
        ckpt,
        engine.host,
        engine.port,
        custom_generate_function_path="aclarena_slime.rollout.generate",
        custom_rm_path="aclarena_slime.rollout.reward",
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


def test_slime_loader_finds_both_functions():
    from slime.utils.misc import load_function

    from aclarena_slime import rollout

    assert load_function("aclarena_slime.rollout.generate") is rollout.generate
    assert load_function("aclarena_slime.rollout.reward") is rollout.reward


@pytest.mark.parametrize(
    ("metadata", "label", "replies", "reward", "turns"),
    [
        ({"env": "math"}, "73", ["<think>70+3</think> \\boxed{073}"], 1.0, 1),
        ({"env": "mock"}, "pear", ["<guess>apple</guess>", "<guess>pear</guess>"], 0.9, 2),
    ],
)
async def test_slime_generate_and_rm_drives_our_functions(
    tiny_checkpoint, tiny_tokenizer, metadata, label, replies, reward, turns
):
    from slime.rollout.sglang_rollout import generate_and_rm
    from slime.utils.types import Sample

    async with FakeSGLang(tiny_tokenizer, replies) as engine:
        args = _slime_args(tiny_checkpoint, engine)
        sample = Sample(prompt="What is 70 + 3?", label=label, metadata=dict(metadata))
        params = {"temperature": 1.0, "max_new_tokens": 128, "no_stop_trim": True}
        out = await generate_and_rm(args, sample, params)
    assert isinstance(out, Sample) and out.status is Sample.Status.COMPLETED
    check_invariants(out)
    assert out.tokens[: len(engine.requests[0]["input_ids"])] == engine.requests[0]["input_ids"]
    assert len(engine.requests) == turns and out.reward == pytest.approx(reward)
    assert (0 in out.loss_mask) == (turns > 1)
