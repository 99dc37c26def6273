"""The arena's methods act on a stage's warm start too: replay mixes the earlier domains' gold demos into it,
the KL anchor adds its KL term to the policy the stage starts from."""

from __future__ import annotations

import asyncio

import pytest
import torch

from aclarena_envs.math.data import demo_turns as math_demo_turns
from aclarena_envs.math.env import MathEnvironment
from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.evaluation.suite import HELD_OUT_SEED
from aclarena_slime.local.demos import demo_examples
from aclarena_slime.local.parts import Backprop, KlTerm
from aclarena_slime.local.records import demo_records, prompt_key, replay_mixture
from aclarena_slime.local.sft import (
    ReferenceNll,
    SftError,
    SftSettings,
    frozen_copy,
    masked_kl,
    mean_kl,
    train_sft,
)
from aclarena_slime.local.stage import cached_warm_start, run_stage
from aclarena_slime.rollout import Budgets
from aclarena_slime.testing.local import LEARNABLE, local_session

MATH_DEMOS = "aclarena_envs.math.data.demo_turns"

# The SFT settings these tests do not vary: a micro-batch of 16.
SFT = {"backprop": Backprop(16)}


def _kl(coef: float) -> KlTerm:
    """The KL term at ``coef``, the low-variance estimate."""
    return KlTerm(coef, "low_var_kl")


@pytest.fixture(scope="module")
def math_examples(tiny_model_dir):
    from transformers import AutoTokenizer

    chat = ChatTokens(AutoTokenizer.from_pretrained(tiny_model_dir))
    env = MathEnvironment({"workers": 1})

    async def run():
        try:
            return await demo_examples(env, chat, env.demo_records(16, seed=0), math_demo_turns, Budgets(512), 1.0)
        finally:
            await env.aclose()

    return asyncio.run(run())[0]


def _trained(tiny_model_dir, examples, settings, with_reference=True):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    start = frozen_copy(model)
    report = train_sft(model, examples, settings, pad_id=0, seed=0, reference=start if with_reference else None)
    return model, start, report


class _Counted(torch.nn.Module):
    """A reference that counts the sequences it is asked about."""

    def __init__(self, model):
        super().__init__()
        self.model, self.sequences = model, 0

    def forward(self, **inputs):
        self.sequences += len(inputs["input_ids"])
        return self.model(**inputs)


def test_the_anchor_asks_its_frozen_reference_once_per_example_with_the_same_kl(tiny_model_dir, math_examples):
    """The reference does not change while SFT runs: its NLLs are computed once per distinct example, not on
    every batch (16 steps of 8 over 16 examples drew each 8 times), and the KL is the one a forward per batch gives."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = _Counted(frozen_copy(model))
    report = train_sft(model, math_examples, SftSettings(steps=16, batch_size=8, lr=3e-3, kl=_kl(1.0), **SFT), 0, 0,
                       reference)  # fmt: skip
    distinct = len({tuple(e.tokens) for e in math_examples})
    assert reference.sequences == distinct  # before: 16 x 8 for the steps and 16 more for kl_after
    kl = report["kl_after"]
    assert kl > 0 and kl == pytest.approx(mean_kl(model, reference.model, math_examples, 0, "low_var_kl", 16), rel=1e-5)
    batch = math_examples[:8]
    direct = masked_kl(model, reference.model, batch, 0, "k3")[1]
    assert float(masked_kl(model, ReferenceNll(reference.model, math_examples, 0, 4), batch, 0, "k3")[1]) == (
        pytest.approx(float(direct), rel=1e-5)
    )


def test_the_anchored_sft_moves_less_from_its_start_than_the_plain_one(tiny_model_dir, math_examples):
    plain_settings = SftSettings(steps=8, batch_size=8, lr=3e-3, kl=_kl(0.0), **SFT)
    plain, start, plain_report = _trained(tiny_model_dir, math_examples, plain_settings)
    anchored, _, report = _trained(
        tiny_model_dir, math_examples, SftSettings(steps=8, batch_size=8, lr=3e-3, kl=_kl(1.0), **SFT)
    )
    plain_kl = mean_kl(plain, start, math_examples, 0, "low_var_kl", 16)
    assert 0 < report["kl_after"] < plain_kl  # same data, seed and schedule: the anchor held the policy nearer
    assert report["kl_after"] == pytest.approx(mean_kl(anchored, start, math_examples, 0, "low_var_kl", 16))
    assert report["kl_coef"] == 1.0 and report["kl_first"] >= 0 and report["kl_last"] > 0
    assert report["nll_after"] < report["nll_before"]  # it still learns the demos
    # Coefficient 0 is the plain SFT exactly: the reference is not used, the report and weights are today's.
    _, _, unreferenced = _trained(tiny_model_dir, math_examples, plain_settings, with_reference=False)
    assert {k: v for k, v in unreferenced.items() if k != "seconds"} == {
        k: v for k, v in plain_report.items() if k != "seconds"
    }
    assert not any(k.startswith("kl") for k in plain_report)
    again, _, _ = _trained(tiny_model_dir, math_examples, plain_settings, with_reference=False)
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), plain.parameters(), strict=True))
    with pytest.raises(SftError, match="reference"):
        train_sft(plain, math_examples, SftSettings(steps=1, batch_size=16, lr=1e-3, kl=_kl(0.1), **SFT), pad_id=0)
    with pytest.raises(ValueError, match="kl_loss_type"):
        KlTerm(0.1, "k4")


IFEVAL_STAGE = (
    *LEARNABLE, "data.env=ifeval", "+env_config.ifeval={}", "rollout.num_rollout=1", "rollout.rollout_batch_size=2",
    "rollout.n_samples_per_prompt=2", "rollout.rollout_max_response_len=48", "++cluster.local.eval_size=2",
    "++cluster.local.torch_threads=1", "++cluster.local.progress=false", "++cluster.local.warm_start_steps=2",
    "++cluster.local.warm_start_records=16", "++cluster.local.warm_start_batch_size=8",
    "++cluster.local.warm_start_demos=aclarena_envs.ifeval.demo_answers.demo_turns", "lora.enabled=false",
)  # fmt: skip


@pytest.mark.slow
def test_the_replay_warm_start_trains_on_the_earlier_domains_demos(tmp_path):
    """Replay's share of the warm start's records are the earlier domain's (math), replayed through its own env at
    its own budget; the metrics say how many of each env went in. The anchored warm start reports its KL, and
    the GRPO phase's reference is the stage's start, not the warm-started model."""
    replay = ("++custom.aclarena_replay={enabled: true, share: 0.25, rule: uniform, current: ifeval, "
              "data: {math: unused}, warm_start: {math: {demos: " + MATH_DEMOS + ", max_response_len: 32, "
              "min_reward: null}}}", "++env_config.math.workers=1")  # fmt: skip
    kl = ("algorithm.use_kl_loss=true", "algorithm.kl_loss_coef=0.1")
    cfg = (*IFEVAL_STAGE, *replay, *kl)
    metrics = run_stage(local_session(tmp_path, *cfg))
    warm = metrics["warm_start"]
    assert warm["mixed"]["math"] == 4 and warm["replayed"]["math"]["records"] == 4  # a quarter of 16
    assert warm["replayed"]["math"]["kept"] == 4  # the math demos fit math's own budget
    assert warm["sft"]["examples"] == warm["mixed"]["math"] + warm["mixed"]["ifeval"]
    assert warm["sft"]["kl_after"] > 0
    # The GRPO phase measures (and anchors) the policy against the stage's start: already apart at step 0.
    assert metrics["steps"][0]["kl_to_start"] > 0
    # The warm start depends on the replay and the KL term: a changed one is not the cached backbone.
    assert asyncio.run(cached_warm_start(local_session(tmp_path, *cfg))) is not None
    assert asyncio.run(cached_warm_start(local_session(tmp_path, *IFEVAL_STAGE, *replay))) is None
    assert asyncio.run(cached_warm_start(local_session(tmp_path, *IFEVAL_STAGE, *kl))) is None


def test_replayed_records_are_never_an_earlier_domains_held_out_prompts(tmp_path):
    session = local_session(
        tmp_path, *LEARNABLE, "data.env=ifeval", "+env_config.ifeval={}", "rollout.num_rollout=8",
        "rollout.rollout_batch_size=16", "++cluster.local.eval_size=32", "++cluster.local.progress=false",
        "++custom.aclarena_replay={enabled: true, share: 0.5, current: ifeval, data: {math: unused}}",
    )  # fmt: skip
    records, per_step = session.records, session.loop.sampling.prompts_per_step
    own = [{"prompt": f"p{i}", "metadata": {"env": "ifeval"}} for i in range(128)]
    replayed = [r for r in replay_mixture(records, own, {"math": {}}, per_step) if r["metadata"]["env"] == "math"]
    env = MathEnvironment({})
    held_out = {prompt_key(r) for r in demo_records(env, 32, HELD_OUT_SEED)}
    assert len(replayed) == 64 and not {prompt_key(r) for r in replayed} & held_out
    assert replay_mixture(records, own, {"math": {}}, per_step=8, domains=["search"]) is own  # no domain with demos


@pytest.mark.slow
def test_a_stage_without_its_own_evaluations_trains_exactly_the_same(tmp_path):
    """``stage_eval=false`` (the arena: its evaluator measures every stage afterwards) skips the stage's own held-out
    evaluations and nothing else: the same records, rollouts, updates and weights."""
    from safetensors.torch import load_file

    runs = {}
    for stage_eval in (True, False):
        session = local_session(
            tmp_path / str(stage_eval), *LEARNABLE, "data.env=math", "++env_config.math.workers=1",
            "rollout.num_rollout=2", "rollout.rollout_batch_size=2", "rollout.n_samples_per_prompt=4",
            "rollout.rollout_max_response_len=16", "++cluster.local.eval_size=2", "++cluster.local.torch_threads=1",
            "++cluster.local.progress=false", "++cluster.local.warm_start_steps=2", "++cluster.local.warm_start_records=8",
            f"++cluster.local.warm_start_demos={MATH_DEMOS}", "lora.enabled=false",
            f"++cluster.local.stage_eval={str(stage_eval).lower()}",
        )  # fmt: skip
        runs[stage_eval] = (run_stage(session), load_file(session.paths.policy_dir / "model.safetensors"))
    (full, full_weights), (bare, bare_weights) = runs[True], runs[False]
    assert full["eval_after"]["n"] == 2 and bare["eval_after"]["n"] == bare["eval_before"]["n"] == 0
    assert bare["eval_after"]["prompts"] == 0 and bare["eval_after"]["samples_per_prompt"] == 1
    assert bare["records"] == full["records"]
    # The engine-vs-trainer log-prob gap is float noise (~1e-7) that moves with how requests share the engine's
    # batches, which the evaluations change; everything the update reads is equal.
    noise = ("logprob_mismatch", "parity_mean_abs", "parity_max_abs")
    drop = ("seconds", *noise)
    assert [{k: v for k, v in s.items() if k not in drop} for s in bare["steps"]] == [
        {k: v for k, v in s.items() if k not in drop} for s in full["steps"]
    ]
    assert all(s.get(k, 0.0) < 1e-5 for s in bare["steps"] + full["steps"] for k in noise)
    assert bare["warm_start"]["sft"]["nll_after"] == full["warm_start"]["sft"]["nll_after"]
    assert all(torch.equal(bare_weights[k], full_weights[k]) for k in full_weights)
