"""The generic token-in/token-out rollout against the fake SGLang engine (no slime needed)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from aclarena_slime.plugin import registry
from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, EpisodeAborted, Observation, Score
from aclarena_slime.rollout import MissingEnvTag
from aclarena_slime.slime_edge.rollout import generate, reward, reward_post_process
from aclarena_slime.testing.fake_sglang import FakeSGLang, Reply, fake_logprob
from aclarena_slime.testing.samples import FakeSample, check_invariants, make_args

S = FakeSample.Status


def _args(ckpt, engine, **kw):
    return make_args(ckpt, engine.host, engine.port, **kw)


def _params():
    return {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 256}


async def test_math_sample_keeps_engine_tokens_and_scores(tiny_checkpoint, tiny_tokenizer):
    async with FakeSGLang(tiny_tokenizer, ["<think>easy</think> The answer is \\boxed{073}."]) as engine:
        sample = FakeSample(prompt="What is 70 + 3?", label="73", metadata={"env": "math"})
        out = await generate(_args(tiny_checkpoint, engine), sample, _params())
    check_invariants(out)
    request = engine.requests[0]
    assert out.tokens[: len(request["input_ids"])] == request["input_ids"]
    response_ids = out.tokens[len(request["input_ids"]) :]
    assert response_ids[-1] == tiny_tokenizer.eos_token_id
    assert out.rollout_log_probs == [fake_logprob(i, t) for i, t in enumerate(response_ids)]
    assert out.loss_mask == [1] * out.response_length
    assert out.status is S.COMPLETED
    assert "<think>easy</think>" in out.response
    # the prompt went through the chat template with the env's instruction
    prompt_text = tiny_tokenizer.decode(request["input_ids"])
    assert prompt_text.startswith("<|im_start|>user\nWhat is 70 + 3?") and "\\boxed{}" in prompt_text
    assert prompt_text.endswith("<|im_start|>assistant\n")
    assert await reward(_args(tiny_checkpoint, engine), out) == 1.0
    assert out.metadata["aclarena"]["score"]["breakdown"]["method"] == "integer"


async def test_two_turn_episode_masks_the_observation(tiny_checkpoint, tiny_tokenizer):
    replies = ["<guess>apple</guess>", "<guess>pear</guess>"]
    async with FakeSGLang(tiny_tokenizer, replies) as engine:
        sample = FakeSample(prompt="", label="pear", metadata={"env": "mock"})
        out = await generate(_args(tiny_checkpoint, engine), sample, _params())
    check_invariants(out)
    assert out.status is S.COMPLETED and len(engine.requests) == 2
    prompt_len = len(engine.requests[0]["input_ids"])
    # the second request is exactly everything so far: prompt + turn 1 + observation
    assert engine.requests[1]["input_ids"] == out.tokens[: len(engine.requests[1]["input_ids"])]
    mask = out.loss_mask
    zero_span = [i for i, m in enumerate(mask) if m == 0]
    assert zero_span == list(range(zero_span[0], zero_span[-1] + 1)), "observation must be one contiguous span"
    observation_text = tiny_tokenizer.decode(out.tokens[prompt_len + zero_span[0] : prompt_len + zero_span[-1] + 1])
    assert observation_text.startswith("\n<|im_start|>user\nWrong.")
    assert observation_text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    # log-probs: model tokens exact, observation 0.0
    assert all(out.rollout_log_probs[i] == 0.0 for i in zero_span)
    # the full token list decodes to the conversation as the chat template renders it
    rendered = tiny_tokenizer.apply_chat_template(
        out.metadata["aclarena"]["messages"], tokenize=False, add_generation_prompt=False
    )
    assert tiny_tokenizer.decode(out.tokens) == rendered.rstrip("\n")
    assert await reward(_args(tiny_checkpoint, engine), out) == pytest.approx(0.9)


async def test_stop_string_turn_gets_closing_tokens_unmasked_by_model(tiny_checkpoint, tiny_tokenizer):
    class StopEnv(Environment):
        tag = "stopper"
        max_turns = 2
        stop = ("</guess>",)

        async def start(self, task):
            ep = MockLike()
            return ep

    class MockLike(Episode):
        conversation = Conversation([{"role": "user", "content": "go"}])
        n = 0

        async def step(self, text):
            self.n += 1
            return Observation([{"role": "user", "content": "again"}]) if self.n == 1 else Done()

        async def score(self):
            return Score(1.0, {"turns": self.n})

    registry.register("stopper", StopEnv)
    async with FakeSGLang(tiny_tokenizer, ["<guess>a</guess> trailing words", "done"]) as engine:
        out = await generate(_args(tiny_checkpoint, engine), FakeSample(metadata={"env": "stopper"}), _params())
    check_invariants(out)
    assert engine.requests[0]["sampling_params"]["stop"] == ["</guess>"]
    first_turn = out.metadata["aclarena"]["turns"][0]
    assert first_turn == "<guess>a</guess>"
    prompt_len = len(engine.requests[0]["input_ids"])
    first_zero = out.loss_mask.index(0)
    # the model stopped on a stop string: the template's <|im_end|> is part of the (masked) observation
    assert out.tokens[prompt_len + first_zero] == tiny_tokenizer.eos_token_id


async def test_budget_truncates_and_still_scores(tiny_checkpoint, tiny_tokenizer):
    async with FakeSGLang(tiny_tokenizer, ["a very long answer " * 50 + "\\boxed{5}"]) as engine:
        args = _args(tiny_checkpoint, engine, rollout_max_response_len=16)
        params = {k: v for k, v in _params().items() if k != "max_new_tokens"}
        out = await generate(args, FakeSample(prompt="p", label="5", metadata={"env": "math"}), params)
    check_invariants(out)
    assert out.response_length == 16 and out.status is S.TRUNCATED
    assert engine.requests[0]["sampling_params"]["max_new_tokens"] == 16
    assert out.metadata["aclarena"]["score"]["reward"] == 0.0


async def test_observation_overflowing_the_budget_is_cut(tiny_checkpoint, tiny_tokenizer):
    async with FakeSGLang(tiny_tokenizer, ["<guess>x</guess>"]) as engine:
        args = _args(tiny_checkpoint, engine, rollout_max_response_len=12)
        out = await generate(args, FakeSample(label="zebra", metadata={"env": "mock"}), {"max_new_tokens": 12})
    check_invariants(out)
    assert out.response_length == 12 and out.status is S.TRUNCATED


async def test_turn_limit(tiny_checkpoint, tiny_tokenizer):
    async with FakeSGLang(tiny_tokenizer, ["<guess>no</guess>"]) as engine:
        args = _args(tiny_checkpoint, engine, aclarena_env_config={"mock": {"max_turns": 2}})
        out = await generate(args, FakeSample(label="yes", metadata={"env": "mock"}), _params())
    check_invariants(out)
    assert len(engine.requests) == 2 and out.status is S.TRUNCATED
    assert out.metadata["aclarena"]["end"] == "turn_limit"
    assert out.loss_mask[-1] == 1, "no observation after the last allowed turn"
    assert await reward(args, out) == 0.0


async def test_engine_abort_marks_aborted(tiny_checkpoint, tiny_tokenizer):
    async with FakeSGLang(tiny_tokenizer, [Reply("partial", finish="abort")]) as engine:
        out = await generate(_args(tiny_checkpoint, engine), FakeSample(label="1", metadata={"env": "math"}), _params())
    check_invariants(out)
    assert out.status is S.ABORTED and not out.remove_sample
    assert "score" not in out.metadata["aclarena"]


@pytest.mark.parametrize("failure", ["crash", "abort"])
async def test_env_errors_fail_or_abort_with_reason(tiny_checkpoint, tiny_tokenizer, failure):
    class Fragile(Episode):
        conversation = Conversation([{"role": "user", "content": "hi"}])

        async def step(self, text):
            if failure == "crash":
                raise RuntimeError("simulated env bug")
            raise EpisodeAborted("user simulator timed out")

        async def score(self):
            return Score(0.0)

    class FragileEnv(Environment):
        tag = f"fragile-{failure}"

        async def start(self, task):
            return Fragile()

    registry.register(FragileEnv.tag, FragileEnv)
    async with FakeSGLang(tiny_tokenizer, ["hello"]) as engine:
        out = await generate(_args(tiny_checkpoint, engine), FakeSample(metadata={"env": FragileEnv.tag}), _params())
    check_invariants(out)
    record = out.metadata["aclarena"]
    assert out.remove_sample and out.reward == 0.0, "a placeholder reward for slime's metrics, never trained on"
    assert await reward(_args(tiny_checkpoint, engine), out) == 0.0
    if failure == "crash":
        assert out.status is S.FAILED and "simulated env bug" in record["error"]
    else:
        assert out.status is S.ABORTED and "timed out" in record["error"]


async def test_lora_path_from_expert_manifest(tiny_checkpoint, tiny_tokenizer, tmp_path):
    manifest = tmp_path / "experts.json"
    manifest.write_text(json.dumps({"version": 1, "experts": {"math": {"adapter": "math-v1", "path": "experts/math"}}}))
    async with FakeSGLang(tiny_tokenizer, ["\\boxed{1}"]) as engine:
        args = _args(tiny_checkpoint, engine, aclarena_experts=str(manifest))
        await generate(args, FakeSample(prompt="p", label="1", metadata={"env": "math"}), _params())
        assert engine.requests[-1]["lora_path"] == "math-v1"
        with pytest.raises(KeyError, match="known tags: math"):
            await generate(args, FakeSample(label="x", metadata={"env": "mock"}), _params())


async def test_missing_env_tag_is_a_clear_error(tiny_checkpoint, tiny_tokenizer):
    async with FakeSGLang(tiny_tokenizer, ["x"]) as engine:
        with pytest.raises(MissingEnvTag, match="metadata.env"):
            await generate(_args(tiny_checkpoint, engine), FakeSample(prompt="p"), _params())


async def test_reward_replays_a_sample_from_elsewhere(tiny_checkpoint):
    args = make_args(tiny_checkpoint, "127.0.0.1", 1)
    sample = FakeSample(prompt="p", label="pear", response="<guess>pear</guess>", metadata={"env": "mock"})
    assert await reward(args, sample) == 1.0
    sample = FakeSample(prompt="p", label="12", response="\\boxed{13}", metadata={"env": "math"})
    assert await reward(args, sample) == 0.0


async def test_caller_sampling_params_are_not_mutated(tiny_checkpoint, tiny_tokenizer):
    params = _params()
    async with FakeSGLang(tiny_tokenizer, ["\\boxed{1}"]) as engine:
        await generate(
            _args(tiny_checkpoint, engine), FakeSample(prompt="p", label="1", metadata={"env": "math"}), params
        )
    assert params == _params()


async def test_eval_budget_comes_from_sampling_params(tiny_checkpoint, tiny_tokenizer):
    """slime's eval passes each eval dataset's max_response_len as ``max_new_tokens``: it wins over the args."""
    async with FakeSGLang(tiny_tokenizer, ["a very long answer " * 50]) as engine:
        args = _args(tiny_checkpoint, engine, rollout_max_response_len=256)
        params = {**_params(), "max_new_tokens": 10}
        out = await generate(args, FakeSample(prompt="p", label="5", metadata={"env": "math"}), params)
    assert out.response_length == 10 and out.status is S.TRUNCATED
    assert engine.requests[0]["sampling_params"]["max_new_tokens"] == 10


async def test_chat_template_kwargs_reach_the_template(tiny_checkpoint, tiny_tokenizer, tmp_path):
    thinking_off = "<think>\n\n</think>\n\n"
    tokenizer = type(tiny_tokenizer).from_pretrained(tiny_checkpoint)
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "{{- '<|im_start|>assistant\\n' }}",
        "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is false %}{{- '"
        + thinking_off.replace("\n", "\\n")
        + "' }}{%- endif %}",
    )
    assert "enable_thinking" in tokenizer.chat_template
    tokenizer.save_pretrained(tmp_path)
    prompts = []
    for kwargs in ({"enable_thinking": False}, None):
        async with FakeSGLang(tiny_tokenizer, ["\\boxed{1}"]) as engine:
            args = _args(tmp_path, engine, apply_chat_template_kwargs=kwargs)
            await generate(args, FakeSample(prompt="p", label="1", metadata={"env": "math"}), _params())
        prompts.append(tiny_tokenizer.decode(engine.requests[0]["input_ids"]))
    assert prompts[0].endswith("<|im_start|>assistant\n" + thinking_off)
    assert prompts[1].endswith("<|im_start|>assistant\n"), "same checkpoint, other kwargs: not the cached renderer"


async def test_group_rm_reward_takes_and_returns_a_list(tiny_checkpoint):
    args = make_args(tiny_checkpoint, "127.0.0.1", 1, group_rm=True)
    group = [
        FakeSample(prompt="p", label="12", response=f"\\boxed{{{answer}}}", metadata={"env": "math"})
        for answer in (12, 13, 12)
    ]
    assert await reward(args, group) == [1.0, 0.0, 1.0]


async def test_an_env_message_the_template_cannot_render_fails_the_sample(tiny_checkpoint, tiny_tokenizer):
    class NoneContent(Episode):
        def __init__(self, where):
            self.where = where
            content = None if where == "prompt" else "hi"
            self.conversation = Conversation([{"role": "user", "content": content}])

        async def step(self, text):
            return Observation([{"role": "user", "content": None}])

        async def score(self):
            return Score(1.0)

    for where in ("prompt", "observation"):

        class BadMessages(Environment):
            tag = f"bad-messages-{where}"
            max_turns = 2

            async def start(self, task, where=where):
                return NoneContent(where)

        registry.register(BadMessages.tag, BadMessages)
        async with FakeSGLang(tiny_tokenizer, ["hello"]) as engine:
            out = await generate(
                _args(tiny_checkpoint, engine), FakeSample(metadata={"env": BadMessages.tag}), _params()
            )
        check_invariants(out)
        record = out.metadata["aclarena"]
        assert out.status is S.FAILED and out.remove_sample and record["end"] == "render_error"
        assert f"cannot render the env's {where}" in record["error"]
        assert len(engine.requests) == (0 if where == "prompt" else 1)


def _group(rewards, removed=(), group=0):
    return [
        FakeSample(
            group_index=group, reward=r, remove_sample=i in removed, status=S.FAILED if i in removed else S.COMPLETED
        )
        for i, r in enumerate(rewards)
    ]


def _pp_args(**kw):
    base = {"advantage_estimator": "grpo", "rewards_normalization": True, "grpo_std_normalization": True}
    return SimpleNamespace(**{**base, "n_samples_per_prompt": 4, "reward_key": None, **kw})


def test_post_process_keeps_removed_samples_out_of_the_group_baseline():
    samples = _group([1.0, 0.0, 0.0, 0.0], removed={2}) + _group([0.0, 1.0, 1.0, 1.0], removed={3}, group=1)
    raw, rewards = reward_post_process(_pp_args(), samples)
    assert raw == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    # group 0 over the kept three: mean 1/3, std sqrt(1/3); the removed sample gets 0.0
    std = (1 / 3) ** 0.5
    assert rewards[:4] == pytest.approx([(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), 0.0, (-1 / 3) / (std + 1e-6)])
    assert rewards[4:] == pytest.approx([(-2 / 3) / (std + 1e-6), (1 / 3) / (std + 1e-6), (1 / 3) / (std + 1e-6), 0.0])


def test_post_process_follows_slime_estimator_switches():
    samples = _group([1.0, 0.0, 0.0, 0.0], removed={3})
    _, gspo = reward_post_process(_pp_args(advantage_estimator="gspo"), samples)
    _, grpo = reward_post_process(_pp_args(), samples)
    assert gspo == grpo
    _, no_std = reward_post_process(_pp_args(grpo_std_normalization=False), samples)
    assert no_std == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0])
    _, baseline = reward_post_process(_pp_args(advantage_estimator="reinforce_plus_plus_baseline"), samples)
    assert baseline == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0]), "mean only, as slime does"
    _, ppo = reward_post_process(_pp_args(advantage_estimator="ppo"), samples)
    _, off = reward_post_process(_pp_args(rewards_normalization=False), samples)
    assert ppo == off == [1.0, 0.0, 0.0, 0.0]


def test_post_process_groups_by_position_without_group_index_and_reads_reward_key():
    samples = [FakeSample(reward={"acc": r, "fmt": 0.5}) for r in (1.0, 0.0, 0.0, 1.0)]
    samples[1].remove_sample = True
    raw, rewards = reward_post_process(_pp_args(n_samples_per_prompt=2, reward_key="acc"), samples)
    assert raw == [1.0, 0.0, 0.0, 1.0]
    assert rewards[:2] == [0.0, 0.0], "one kept sample: no baseline to compare with"
    assert rewards[2:] == pytest.approx([-0.5 / (0.5**0.5 + 1e-6), 0.5 / (0.5**0.5 + 1e-6)])


async def test_lone_surrogates_in_observations_are_replaced_not_fatal(tiny_checkpoint, tiny_tokenizer):
    """An env that echoes a decoded ``"\\ud800"`` must not get the sample removed by the tokenizer."""

    class Echo(Episode):
        conversation = Conversation([{"role": "user", "content": "go \ud83d"}])
        n = 0

        async def step(self, text):
            self.n += 1
            if self.n > 1:
                return Done()
            return Observation([{"role": "tool", "name": "x\udfff", "content": "Error: \ud800 not found"}])

        async def score(self):
            return Score(1.0)

    class EchoEnv(Environment):
        tag = "surrogate-echo"
        max_turns = 2

        async def start(self, task):
            return Echo()

    registry.register(EchoEnv.tag, EchoEnv)
    async with FakeSGLang(tiny_tokenizer, ["one", "two"]) as engine:
        out = await generate(_args(tiny_checkpoint, engine), FakeSample(metadata={"env": EchoEnv.tag}), _params())
    check_invariants(out)
    assert out.status is S.COMPLETED and not out.remove_sample, out.metadata["aclarena"].get("error")
    messages = out.metadata["aclarena"]["messages"]
    assert messages[0]["content"] == "go \ufffd" and messages[2]["content"] == "Error: \ufffd not found"
    assert "\ufffd not found" in tiny_tokenizer.decode(engine.requests[1]["input_ids"])
    json.dumps(out.metadata).encode("utf-8")  # the sample's record is valid Unicode too
