"""IFEval through the real slime-facing rollout: fake SGLang engine, tiny tokenizer, env from the registry."""

from __future__ import annotations

import json

from aclarena_slime.slime_edge.rollout import generate, reward
from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.samples import FakeSample, check_invariants, make_args

LABEL = json.dumps({"instruction_id_list": ["punctuation:no_comma", "detectable_format:title"], "kwargs": [{}, {}]})
PARAMS = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 256}


async def test_generated_sample_is_scored_by_ifeval(tiny_checkpoint, tiny_tokenizer):
    reply = "<think>no commas, and a title</think>\n\n<<Rain>>\nRain falls on the roof"
    async with FakeSGLang(tiny_tokenizer, [reply]) as engine:
        args = make_args(tiny_checkpoint, engine.host, engine.port)
        sample = FakeSample(prompt="Write about rain. No commas. Add a title.", label=LABEL, metadata={"env": "ifeval"})
        out = await generate(args, sample, PARAMS)
        check_invariants(out)
        assert await reward(args, out) == 1.0
    breakdown = out.metadata["aclarena"]["score"]["breakdown"]
    assert breakdown["thinking_removed"] and breakdown["prompt_strict"]


async def test_instruction_level_reward_from_env_config(tiny_checkpoint, tiny_tokenizer):
    async with FakeSGLang(tiny_tokenizer, ["<<Rain>>\nRain, rain, rain"]) as engine:
        args = make_args(
            tiny_checkpoint, engine.host, engine.port, aclarena_env_config={"ifeval": {"level": "instruction"}}
        )
        sample = FakeSample(prompt="Write about rain.", label=LABEL, metadata={"env": "ifeval"})
        out = await generate(args, sample, PARAMS)
        assert await reward(args, out) == 0.5
