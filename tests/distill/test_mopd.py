"""MOPD plugins against fake teacher engines: the right teacher per env tag, aligned teacher log-probs."""

from __future__ import annotations

import json

import pytest

from aclarena_slime.distill.mopd import TeacherConfigError, response_log_probs
from aclarena_slime.slime_edge.mopd import mopd_post_process, teacher_log_probs_reward
from aclarena_slime.slime_edge.rollout import generate
from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.samples import FakeSample, check_invariants, make_args

S = FakeSample.Status


def teacher_logprob(bias: float, token: int, position: int) -> float:
    return -round(bias + 0.01 * (token % 50) + 0.0001 * position, 6)


class FakeTeacher(FakeSGLang):
    """Answers SGLang's scoring request (``max_new_tokens: 0``) as SGLang does.

    ``meta_info.input_token_logprobs`` covers positions ``logprob_start_len .. len-1`` as
    ``[logprob, token_id, None]``, the first logprob None (sglang scheduler_output_processor_mixin.py).
    The log-probs depend on ``bias[lora_path]`` so a test can tell which teacher/adapter scored.
    """

    def __init__(self, tokenizer, bias: dict[str | None, float], corrupt: str | None = None) -> None:
        super().__init__(tokenizer, ["(teachers do not generate)"])
        self.bias, self.corrupt = bias, corrupt

    def complete(self, payload):
        if (payload.get("sampling_params") or {}).get("max_new_tokens") != 0:
            return super().complete(payload)
        ids = payload["input_ids"]
        start = payload.get("logprob_start_len", -1)
        bias = self.bias[payload.get("lora_path")]
        entries = [[None, ids[start], None]]
        entries += [[teacher_logprob(bias, ids[p], p), ids[p], None] for p in range(start + 1, len(ids))]
        if self.corrupt == "shifted_ids":
            entries = [[lp, tok + 1, x] for lp, tok, x in entries]
        elif self.corrupt == "short":
            entries = entries[:2]
        return {
            "text": "",
            "meta_info": {
                "id": f"teacher-{len(self.requests)}",
                "finish_reason": {"type": "length", "length": 0},
                "prompt_tokens": len(ids),
                "completion_tokens": 0,
                "input_token_logprobs": entries,
                "output_token_logprobs": [],
            },
        }


REPLIES = {
    "math": ["<think>70+3</think> \\boxed{73}"],
    "mock": ["<guess>apple</guess>", "<guess>pear</guess>"],
}


async def _student_samples(ckpt, tokenizer, tags=("math", "mock")):
    """Real rollouts of the generic loop: a one-turn math sample and a two-turn mock sample."""
    out = []
    for i, tag in enumerate(tags):
        async with FakeSGLang(tokenizer, REPLIES[tag]) as student:
            args = make_args(ckpt, student.host, student.port)
            sample = FakeSample(
                group_index=i, index=i, prompt="What is 70 + 3?", label="73" if tag == "math" else "pear"
            )
            sample.metadata = {"env": tag}
            out.append(await generate(args, sample, {"temperature": 1.0, "max_new_tokens": 128}))
    for sample in out:
        check_invariants(sample)
    return out


def _expected(sample, bias):
    n, tokens = sample.response_length, sample.tokens
    return [teacher_logprob(bias, tokens[p], p) for p in range(len(tokens) - n, len(tokens))]


MOPD_KEYS = ("teachers", "teacher_pool", "teacher_experts", "task_reward", "teacher_temperature")


def _mopd_args(ckpt, **kw):
    """slime's args with ``aclarena_mopd`` (the recipe's ``custom.aclarena_mopd``) made of the MOPD keys of ``kw``."""
    mopd = {key: kw.pop(key) for key in MOPD_KEYS if key in kw}
    return make_args(ckpt, "127.0.0.1", 1, rollout_temperature=0.8, aclarena_mopd=mopd, **kw)


async def test_each_sample_is_scored_by_the_teacher_of_its_env_tag(tiny_checkpoint, tiny_tokenizer):
    math_sample, mock_sample = await _student_samples(tiny_checkpoint, tiny_tokenizer)
    assert 0 in mock_sample.loss_mask  # the mock episode has an observation inside its response
    async with FakeTeacher(tiny_tokenizer, {None: 1.0}) as math_t, FakeTeacher(tiny_tokenizer, {None: 2.0}) as mock_t:
        teachers = {"math": math_t.url, "mock": {"url": f"{mock_t.url}/generate"}}
        args = _mopd_args(tiny_checkpoint, teachers=teachers)
        rewards = [await teacher_log_probs_reward(args, s) for s in (math_sample, mock_sample)]
    assert rewards == [0.0, 0.0]  # pure distillation, as the authors ran it
    for sample, teacher, bias in ((math_sample, math_t, 1.0), (mock_sample, mock_t, 2.0)):
        assert len(teacher.requests) == 1
        request = teacher.requests[0]
        assert request["input_ids"] == sample.tokens
        assert request["sampling_params"]["max_new_tokens"] == 0
        assert request["sampling_params"]["temperature"] == 0.8
        assert request["return_logprob"] is True
        assert request["logprob_start_len"] == len(sample.tokens) - sample.response_length - 1
        assert "lora_path" not in request
        assert len(sample.teacher_log_probs) == sample.response_length
        assert sample.teacher_log_probs == _expected(sample, bias)
        assert sample.status is S.COMPLETED and not sample.remove_sample


async def test_lora_experts_on_one_pool_pick_the_adapter_by_tag(tiny_checkpoint, tiny_tokenizer, tmp_path):
    samples = await _student_samples(tiny_checkpoint, tiny_tokenizer)
    manifest = tmp_path / "experts.json"
    full = {"version": 1, "experts": {"math": {"adapter": "math_v1"}, "mock": "mock_v2"}}
    manifest.write_text(json.dumps(full))
    async with FakeTeacher(tiny_tokenizer, {"math_v1": 3.0, "mock_v2": 4.0}) as pool:
        for experts in (str(manifest), full, {"math": "math_v1", "mock": "mock_v2"}):
            # the pool may come from slime's own --rm-url (single-teacher OPD's flag)
            args = _mopd_args(tiny_checkpoint, teacher_experts=experts, rm_url=f"{pool.url}/generate")
            for sample in samples:
                assert await teacher_log_probs_reward(args, sample) == 0.0
    assert [r["lora_path"] for r in pool.requests] == ["math_v1", "mock_v2"] * 3
    assert samples[0].teacher_log_probs == _expected(samples[0], 3.0)
    assert samples[1].teacher_log_probs == _expected(samples[1], 4.0)


async def test_separate_teacher_overrides_the_pool_and_group_rm_takes_lists(tiny_checkpoint, tiny_tokenizer):
    samples = await _student_samples(tiny_checkpoint, tiny_tokenizer)
    async with FakeTeacher(tiny_tokenizer, {"m": 1.0}) as pool, FakeTeacher(tiny_tokenizer, {None: 5.0}) as own:
        args = _mopd_args(
            tiny_checkpoint,
            teacher_pool=pool.url,
            teacher_experts={"math": "m", "mock": "m"},
            teachers={"mock": own.url},
        )
        assert await teacher_log_probs_reward(args, samples) == [0.0, 0.0]
    assert len(pool.requests) == 1 and len(own.requests) == 1
    assert samples[1].teacher_log_probs == _expected(samples[1], 5.0)


@pytest.mark.parametrize("corrupt", ["shifted_ids", "short", "adapter_missing"])
async def test_teacher_errors_abort_the_sample_instead_of_scoring_it(tiny_checkpoint, tiny_tokenizer, corrupt):
    (sample,) = await _student_samples(tiny_checkpoint, tiny_tokenizer, tags=("math",))
    teacher = FakeTeacher(
        tiny_tokenizer, {None: 1.0, "math": 1.0}, corrupt=None if corrupt == "adapter_missing" else corrupt
    )
    async with teacher:
        teachers = {"math": {"url": teacher.url, "lora_path": "math"}}
        if corrupt == "adapter_missing":
            teacher.adapters["other"] = "/x"  # the fake answers 400 for an adapter it has not loaded
        args = _mopd_args(tiny_checkpoint, teachers=teachers, task_reward=True)
        value = await teacher_log_probs_reward(args, sample)
    assert sample.status is S.ABORTED and sample.remove_sample
    assert value == 0.0  # bookkeeping only: the sample is out of training, not a zero-reward sample
    assert sample.teacher_log_probs == sample.rollout_log_probs  # neutral: no KL signal
    assert "teacher" in sample.metadata["aclarena"]["teacher_error"]
    raw, rewards = mopd_post_process(_mopd_args(tiny_checkpoint), [sample])
    assert rewards == [0.0]


async def test_task_reward_is_optional(tiny_checkpoint, tiny_tokenizer):
    math_sample, mock_sample = await _student_samples(tiny_checkpoint, tiny_tokenizer)
    async with FakeTeacher(tiny_tokenizer, {None: 1.0}) as teacher:
        args = _mopd_args(
            tiny_checkpoint,
            teachers={"math": teacher.url, "mock": teacher.url},
            task_reward=True,
        )
        assert await teacher_log_probs_reward(args, math_sample) == 1.0
        assert await teacher_log_probs_reward(args, mock_sample) == pytest.approx(0.9)  # second guess


async def test_unknown_tag_and_missing_teachers_are_configuration_errors(tiny_checkpoint, tiny_tokenizer):
    (sample,) = await _student_samples(tiny_checkpoint, tiny_tokenizer, tags=("math",))
    with pytest.raises(TeacherConfigError, match="no MOPD teacher for env tag 'math'.*search"):
        await teacher_log_probs_reward(
            _mopd_args(tiny_checkpoint, teachers={"search": "http://x:1"}), sample
        )
    with pytest.raises(TeacherConfigError, match="MOPD needs teachers"):
        await teacher_log_probs_reward(_mopd_args(tiny_checkpoint), sample)
    with pytest.raises(TeacherConfigError, match="needs a pool"):
        await teacher_log_probs_reward(_mopd_args(tiny_checkpoint, teacher_experts={"math": "a"}), sample)
    assert sample.teacher_log_probs is None and sample.status is S.COMPLETED


def test_post_process_fills_unscored_samples_and_normalizes_kept_ones_per_group():
    def sample(group, reward, n=3, removed=False):
        s = FakeSample(group_index=group, response_length=n, rollout_log_probs=[-0.5] * n, reward=reward)
        s.teacher_log_probs = [-1.0] * n if reward is not None else None
        s.remove_sample = removed
        return s

    # group 0: two kept rewards and one aborted during rollout (never reached the reward function)
    samples = [sample(0, 1.0), sample(0, 0.0), sample(0, None), sample(1, 0.0), sample(1, 0.0)]
    args = _args_ns(advantage_estimator="grpo", n_samples_per_prompt=3)
    raw, rewards = mopd_post_process(args, samples)
    assert raw == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert samples[2].remove_sample and samples[2].teacher_log_probs == [-0.5, -0.5, -0.5]
    assert rewards[0] == pytest.approx(0.5 / (2**0.5 / 2 + 1e-6)) and rewards[1] == pytest.approx(-rewards[0])
    assert rewards[2:] == [0.0, 0.0, 0.0]
    assert all(len(s.teacher_log_probs) == s.response_length for s in samples)
    raw, plain = mopd_post_process(_args_ns(advantage_estimator="ppo"), [sample(0, 0.25)])
    assert plain == [0.25]


def _args_ns(**kw):
    from types import SimpleNamespace

    return SimpleNamespace(**{"rewards_normalization": True, "grpo_std_normalization": True, **kw})


def test_response_log_probs_accepts_a_full_prefill_answer_and_checks_alignment():
    tokens = [5, 6, 7, 8, 9]
    full = {"meta_info": {"input_token_logprobs": [[None, 5, None]] + [[-0.1 * t, t, None] for t in tokens[1:]]}}
    assert response_log_probs(full, tokens, 2) == [pytest.approx(-0.8), pytest.approx(-0.9)]
    with pytest.raises(Exception, match="no teacher log-prob"):
        response_log_probs(full, tokens, 5)  # the first position has none
    with pytest.raises(Exception, match="no input log-probs"):
        response_log_probs({"meta_info": {}}, tokens, 2)
