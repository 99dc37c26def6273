"""Search through the real slime-facing rollout: fake SGLang engine, tiny tokenizer, env from the registry."""

from __future__ import annotations

from aclarena_envs.search.demo_corpus import generate, write_jsonl
from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.slime_edge.rollout import generate as rollout_generate
from aclarena_slime.slime_edge.rollout import reward
from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.samples import FakeSample, check_invariants, make_args, mask_runs

DEMO = generate(60, seed=5)
QUESTION = DEMO.questions[0]
PARAMS = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 512}


async def test_search_then_answer_masks_the_information_and_scores_one(tmp_path, tiny_checkpoint, tiny_tokenizer):
    corpus = write_jsonl(DEMO.passages, tmp_path / "corpus.jsonl")
    turns = [
        f"<think>I should look this up.</think>\n<search> {QUESTION.question} </search>",
        f"<think>The passage says it.</think>\n<answer> {QUESTION.answers[0]} </answer>",
    ]
    async with FakeSGLang(tiny_tokenizer, turns) as engine:
        args = make_args(
            tiny_checkpoint,
            engine.host,
            engine.port,
            rollout_max_response_len=2048,
            aclarena_env_config={"search": {"corpus": str(corpus), "topk": 3}},
        )
        sample = FakeSample(prompt=QUESTION.question, label={"target": QUESTION.answers}, metadata={"env": "search"})
        out = await rollout_generate(args, sample, PARAMS)
        check_invariants(out)
        assert await reward(args, out) == 1.0
        assert engine.requests[0]["sampling_params"]["stop"][-2:] == ["</search>", "</answer>"]

    response_ids = out.tokens[len(out.tokens) - out.response_length :]
    runs = mask_runs(out.loss_mask)
    assert [value for value, _, _ in runs] == [1, 0, 1], "model turn, observation, model turn"
    (_, a, b), (_, c, d), (_, e, f) = runs
    model_1, observation, model_2 = (tiny_tokenizer.decode(response_ids[s:t]) for s, t in ((a, b), (c, d), (e, f)))
    assert model_1 == turns[0]
    assert model_2.startswith(turns[1])
    # The masked span is the observation exactly: chat-template glue around the <information> block,
    # with none of the model's text in it and all of the retrieved passages.
    information = observation[
        observation.index("<information>") : observation.index("</information>") + len("</information>")
    ]
    assert information.startswith("<information>Doc 1(Title: ") and information.count("Doc ") == 3
    assert QUESTION.answers[0] in information
    [obs_message] = [m for m in out.metadata["aclarena"]["messages"] if m["content"] == information]
    assert obs_message["role"] == "user"
    assert observation == ChatTokens(tiny_tokenizer).observation_text([obs_message], response_ids[b - 1])
    outside = observation.replace(information, "")
    assert "<search>" not in outside and "<answer>" not in outside and "Doc " not in outside
    assert out.rollout_log_probs[c:d] == [0.0] * (d - c)
    breakdown = out.metadata["aclarena"]["score"]["breakdown"]
    assert breakdown["searches"] == 1 and breakdown["well_formed"] and out.status.value == "completed"


async def test_reward_replays_dumped_turns(tmp_path):
    """reward() alone (e.g. on a dumped rollout) steps the recorded turns through a fresh episode."""
    sample = FakeSample(
        prompt="q", label='{"target": ["Paris"]}', metadata={"env": "search"}, response="<answer>Paris</answer>"
    )
    args = make_args("unused", "127.0.0.1", 1, aclarena_env_config={"search": {"max_turns": 3}})
    assert await reward(args, sample) == 1.0
    sample.metadata = {"env": "search", "aclarena": {"turns": ["<search>x</search>", "<answer>London</answer>"]}}
    assert await reward(args, sample) == 0.0
