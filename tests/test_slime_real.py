"""The slime-facing functions against real slime (runs where slime is importable; CI has no slime).

Slime's own loader finds them by dotted path, and slime's own ``generate_and_rm`` drives them with
its real ``Sample``: a one-turn math sample and a two-turn sample keep the token invariants.
"""

from __future__ import annotations

import pytest

from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.samples import check_invariants, make_slime_args

pytestmark = pytest.mark.slime


def test_slime_loader_finds_both_functions():
    from slime.utils.misc import load_function

    from aclarena_slime.slime_edge import rollout

    assert load_function("aclarena_slime.slime_edge.rollout.generate") is rollout.generate
    assert load_function("aclarena_slime.slime_edge.rollout.reward") is rollout.reward


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
        args = make_slime_args(tiny_checkpoint, engine.host, engine.port)
        sample = Sample(prompt="What is 70 + 3?", label=label, metadata=dict(metadata))
        params = {"temperature": 1.0, "max_new_tokens": 128, "no_stop_trim": True}
        out = await generate_and_rm(args, sample, params)
    assert isinstance(out, Sample) and out.status is Sample.Status.COMPLETED
    check_invariants(out)
    assert out.tokens[: len(engine.requests[0]["input_ids"])] == engine.requests[0]["input_ids"]
    assert len(engine.requests) == turns and out.reward == pytest.approx(reward)
    assert (0 in out.loss_mask) == (turns > 1)
