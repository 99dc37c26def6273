"""The SFT warm start of a local stage: gold demos replayed through the env, the SFT step, the held-out split."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from aclarena_envs.ifeval.demo_answers import demo_turns as ifeval_demo_turns
from aclarena_envs.ifeval.env import IFEvalEnvironment
from aclarena_envs.math.data import demo_turns as math_demo_turns
from aclarena_envs.math.env import MathEnvironment
from aclarena_envs.search.data import demo_turns as search_demo_turns
from aclarena_envs.search.env import SearchEnvironment
from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.local.demos import DemoError, ScriptedClient, demo_examples, load_demo_turns
from aclarena_slime.local.parts import Backprop, KlTerm
from aclarena_slime.local.records import RecordError, prompt_key, stage_records
from aclarena_slime.local.sft import SftError, SftExample, SftSettings, mean_nll, train_sft, warm_start
from aclarena_slime.local.stage import cached_warm_start, tokenizer_texts
from aclarena_slime.local.tiny_model import TinyShape, build_tiny_tokenizer
from aclarena_slime.rollout import Budgets
from aclarena_slime.testing.local import LEARNABLE, local_recipe, local_session

# The SFT settings these tests do not vary: a micro-batch of 16, no KL term.
SFT = {"backprop": Backprop(16), "kl": KlTerm(0.0, "low_var_kl")}
# The small math stage with a warm start that the stage tests run (the env settings: one verifier worker).
MATH_STAGE = (*LEARNABLE, "data.env=math", "++env_config.math.workers=1", "rollout.num_rollout=1",
              "rollout.rollout_batch_size=2", "rollout.n_samples_per_prompt=2", "rollout.rollout_max_response_len=16",
              "++cluster.local.eval_size=2", "++cluster.local.torch_threads=1", "++cluster.local.progress=false",
              "++cluster.local.warm_start_steps=3", "++cluster.local.warm_start_records=8",
              "++cluster.local.warm_start_demos=aclarena_envs.math.data.demo_turns")  # fmt: skip


@pytest.fixture(scope="module")
def chat(tiny_model_dir):
    from transformers import AutoTokenizer

    return ChatTokens(AutoTokenizer.from_pretrained(tiny_model_dir))


def _eot(chat: ChatTokens) -> int:
    return chat.tokenizer.convert_tokens_to_ids("<|im_end|>")


def _replay(env, chat, records, turns_of, min_reward=1.0, budget=512):
    async def run():
        try:
            return await demo_examples(env, chat, records, turns_of, Budgets(budget), min_reward)
        finally:
            await env.aclose()

    return asyncio.run(run())


def test_search_demos_replay_through_the_env_and_train_only_the_model_turns(chat):
    env = SearchEnvironment({})
    records = [r for r in env.demo_records(12, seed=0) if len(search_demo_turns(r)) == 2][:4]  # grounded ones
    examples, report = _replay(env, chat, records, search_demo_turns)
    assert (report.replayed, report.kept, report.mean_reward) == (4, 4, 1.0)  # the env's own EM says gold
    for example, record in zip(examples, records, strict=True):
        trained = [t for t, m in zip(example.tokens, example.loss_mask, strict=True) if m]
        text = chat.tokenizer.decode(trained, skip_special_tokens=True)
        # Both model turns are trained on; the prompt and the retrieved passages are not.
        assert text == "".join(search_demo_turns(record))
        untrained = chat.tokenizer.decode([t for t, m in zip(example.tokens, example.loss_mask, strict=True) if not m])
        assert "<information>" in untrained and record["prompt"] in untrained


def test_demos_that_the_env_scores_low_are_dropped(chat):
    env = MathEnvironment({"workers": 1})
    records = env.demo_records(3, seed=0)
    examples, report = _replay(env, chat, records, lambda r: [f"\\boxed{{{int(r['label']) + 1}}}"])
    assert (examples, report.kept, report.below_reward) == ([], 0, 3)


def test_a_demo_longer_than_the_budget_is_not_kept(chat):
    env = MathEnvironment({"workers": 1})
    examples, report = _replay(env, chat, env.demo_records(2, seed=0), math_demo_turns, budget=3)
    assert (examples, report.not_completed) == ([], 2)


def test_scripted_turns_end_as_the_engine_ends_them(chat):
    client = ScriptedClient(chat, ["<search> x </search>", "<answer> y </answer>", "plain"], end_of_turn=_eot(chat))
    params = {"stop": ["</search>"], "max_new_tokens": 100}
    first = asyncio.run(client.generate([1], params))
    assert first["output_ids"][-1] != _eot(chat) and first["meta_info"]["finish_reason"]["matched"] == "</search>"
    second = asyncio.run(client.generate([1], params))  # no stop string matched: the turn closes with <|im_end|>
    assert second["output_ids"][-1] == _eot(chat)
    cut = asyncio.run(client.generate([1], {"max_new_tokens": 2}))
    assert len(cut["output_ids"]) == 2 and cut["meta_info"]["finish_reason"]["type"] == "length"


def test_sft_lowers_the_nll_of_demo_trajectories_full_and_lora(chat, tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    env = MathEnvironment({"workers": 1})
    examples, _ = _replay(env, chat, env.demo_records(32, seed=0), math_demo_turns)
    assert len(examples) == 32
    settings = SftSettings(steps=20, batch_size=8, lr=3e-3, **SFT)
    backbone, report = warm_start(tiny_model_dir, examples, settings, tmp_path / "warm", seed=0)
    assert report["nll_after"] < 0.7 * report["nll_before"]
    reloaded = AutoModelForCausalLM.from_pretrained(backbone)  # the saved backbone is the trained one
    assert mean_nll(reloaded, examples, 0, 16) == pytest.approx(report["nll_after"], rel=1e-4)

    torch.manual_seed(0)  # the same step trains only an adapter when the model is a PEFT model
    lora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "lm_head"]),
    )
    frozen = {n: p.detach().clone() for n, p in lora.named_parameters() if not p.requires_grad}
    lora_report = train_sft(lora, examples, SftSettings(steps=10, batch_size=8, lr=1e-2, **SFT), pad_id=0)
    assert lora_report["nll_after"] < lora_report["nll_before"]
    assert all(torch.equal(p, frozen[n]) for n, p in lora.named_parameters() if not p.requires_grad)
    # The report's NLLs are measured on the first nll_examples examples (all of them here, 32 of the default 512).
    assert report["nll_examples"] == 32
    capped = train_sft(reloaded, examples, SftSettings(steps=1, batch_size=8, lr=1e-9, nll_examples=4, **SFT), pad_id=0)
    assert capped["nll_examples"] == 4
    assert capped["nll_after"] == pytest.approx(mean_nll(reloaded, examples[:4], 0, 16), rel=1e-4)


def test_ifeval_demo_answers_follow_most_generated_prompts():
    env = IFEvalEnvironment({})
    records = env.demo_records(200, seed=3)

    async def scores():
        out = []
        for record in records:
            from aclarena_slime.plugin.contract import Task

            episode = await env.start(Task(record["prompt"], record["label"]))
            await episode.step(ifeval_demo_turns(record)[0])
            out.append((await episode.score()).reward)
        return out

    rewards = asyncio.run(scores())
    assert sum(rewards) / len(rewards) > 0.85  # the rest (another language, hundreds of words) get no demo


def test_sft_data_and_settings_errors():
    with pytest.raises(SftError, match="first token"):
        SftExample(tokens=[1, 2], loss_mask=[1, 1])
    with pytest.raises(SftError, match="at least one token"):
        SftExample(tokens=[1, 2], loss_mask=[0, 0])
    with pytest.raises(SftError, match="length"):
        SftExample(tokens=[1, 2], loss_mask=[0])
    with pytest.raises(SftError, match="steps"):
        SftSettings(steps=0, batch_size=16, lr=1e-3, **SFT)
    with pytest.raises(DemoError, match="cannot load"):
        load_demo_turns("aclarena_envs.math.data.no_such_function")
    with pytest.raises(DemoError, match="dotted path"):
        load_demo_turns("nodots")
    assert load_demo_turns("aclarena_envs.math.data:demo_turns") is math_demo_turns


def test_a_warm_start_that_cannot_run_is_said_and_left_out(tmp_path):
    """No gold demos, or a stage continuing an adapter (the warm start would change the backbone under it): the
    stage runs without the warm start, and a warning names why."""
    with pytest.warns(UserWarning, match="no warm_start_demos"):
        assert local_session(tmp_path, *LEARNABLE, "data.env=math", "++cluster.local.warm_start_steps=5").warm_start is None
    chained = ("data.env=math", "++cluster.local.warm_start_steps=5", "++cluster.local.warm_start_demos=a.b",
               "++cluster.local.base_adapter=x")  # fmt: skip
    with pytest.warns(UserWarning, match="base_adapter"):
        assert local_session(tmp_path, *LEARNABLE, *chained).warm_start is None


def test_held_out_prompts_are_never_training_prompts(tmp_path):
    env = MathEnvironment({"workers": 1})
    cfg = [*LEARNABLE, "data.env=math", "++cluster.local.eval_size=64", "rollout.num_rollout=16",
           "rollout.rollout_batch_size=8", "++cluster.local.warm_start_steps=1",
           "++cluster.local.warm_start_demos=aclarena_envs.math.data.demo_turns",
           "++cluster.local.warm_start_records=512"]  # fmt: skip
    split = stage_records(env, local_session(tmp_path, *cfg).records)
    held_out = {prompt_key(r) for r in split.evaluation}
    assert len(split.evaluation) == 64 and len(split.train) == 128 and len(split.warm_start) == 512
    assert not held_out & {prompt_key(r) for r in split.train + split.warm_start}
    assert split.overlap_dropped > 0  # the generator does repeat sums: the split had work to do

    # A data file that holds evaluation prompts loses them too, and says how many.
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in split.evaluation[:5] + split.train[:5]))
    from_file = stage_records(env, local_session(tmp_path, *cfg, f"++cluster.local.data_path={data}").records)
    assert from_file.overlap_dropped == 5 and not held_out & {prompt_key(r) for r in from_file.train}

    data.write_text("".join(json.dumps(r) + "\n" for r in split.evaluation[:5]))
    with pytest.warns(UserWarning, match="not held out"):  # nothing else to train on: kept, and said
        only_eval = stage_records(env, local_session(tmp_path, *cfg, f"++cluster.local.data_path={data}").records)
    assert not only_eval.held_out and only_eval.counts()["held_out"] is False
    asyncio.run(env.aclose())


def test_rl_prompts_are_not_the_warm_starts_prompts(tmp_path):
    """The warm-started tiny model answers its warm-start prompts from memory (issue 25's diagnostics: sampled
    reward 0.30 on them, 0.06 on held-out prompts); GRPO trains on others, and its prompts do not move the
    warm start's records (a cached warm start stays valid when the RL steps change)."""
    env = SearchEnvironment({})
    cfg = [*LEARNABLE, "data.env=search", "++cluster.local.eval_size=8", "rollout.num_rollout=4",
           "rollout.rollout_batch_size=8", "++cluster.local.warm_start_steps=1",
           "++cluster.local.warm_start_demos=aclarena_envs.search.data.demo_turns",
           "++cluster.local.warm_start_records=64"]  # fmt: skip
    split = stage_records(env, local_session(tmp_path, *cfg).records)
    assert len(split.train) == 32 and len(split.warm_start) == 64
    assert not {prompt_key(r) for r in split.train} & {prompt_key(r) for r in split.warm_start}
    longer = stage_records(env, local_session(tmp_path, *cfg, "rollout.num_rollout=8").records)
    assert longer.warm_start == split.warm_start and longer.train[:32] == split.train
    asyncio.run(env.aclose())


def test_validation_prompts_come_out_of_the_rl_records_and_are_never_trained_on(tmp_path):
    """Settings are chosen on validation prompts (issue 25): neither warm-start, RL nor held-out prompts, drawn
    before the RL prompts so that these stay put when the steps change; too few to carve them is an error."""
    env = MathEnvironment({"workers": 1})
    cfg = [*LEARNABLE, "data.env=math", "++cluster.local.eval_size=16", "rollout.num_rollout=4",
           "rollout.rollout_batch_size=8", "++cluster.local.warm_start_steps=1",
           "++cluster.local.warm_start_demos=aclarena_envs.math.data.demo_turns",
           "++cluster.local.warm_start_records=64", "++cluster.local.validation_size=16"]  # fmt: skip
    split = stage_records(env, local_session(tmp_path, *cfg).records)
    checked = [prompt_key(r) for r in split.validation]
    assert len(split.validation) == len(set(checked)) == 16 and split.counts()["validation"] == 16
    others = split.train + split.warm_start + split.evaluation
    assert not set(checked) & {prompt_key(r) for r in others}
    without = stage_records(env, local_session(tmp_path, *cfg, "++cluster.local.validation_size=0").records)
    assert without.warm_start == split.warm_start and without.validation == []  # the warm start stays valid
    longer = stage_records(env, local_session(tmp_path, *cfg, "rollout.num_rollout=8").records)
    assert longer.validation == split.validation and longer.train[:32] == split.train

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in split.train[:10]))
    from_file = [*cfg, f"++cluster.local.data_path={data}", "++cluster.local.warm_start_steps=0"]
    with pytest.raises(RecordError, match="validation_size=16: only"):
        stage_records(env, local_session(tmp_path, *from_file).records)
    distinct = len({prompt_key(r) for r in split.train[:10]})
    with pytest.raises(RecordError, match="leaves no RL prompt"):
        stage_records(env, local_session(tmp_path, *from_file, f"++cluster.local.validation_size={distinct}").records)
    with pytest.raises(ValueError, match="validation_size must be a non-negative integer"):
        local_recipe(tmp_path, *cfg, "++cluster.local.validation_size=-1")
    asyncio.run(env.aclose())


@pytest.mark.parametrize(("seed", "eval_size"), [(5, 16), (0, 2), (1, 0)])
def test_the_monitors_demo_prompts_are_never_training_prompts_whatever_the_seed(tmp_path, seed, eval_size):
    """The evaluation runner and the forgetting monitor check the demo records of HELD_OUT_SEED, up to the
    largest demo_size a monitor accepts; a stage holds them out of its training records whatever its seed and
    its own eval size (a small eval size at seed 0 or 1 used to leave some of a monitor's prompts in)."""
    from aclarena_slime.evaluation.monitor import MonitorError, MonitorSettings
    from aclarena_slime.evaluation.suite import HELD_OUT_DEMOS, HELD_OUT_SEED

    env = MathEnvironment({"workers": 1})
    cfg = [*LEARNABLE, "data.env=math", f"++cluster.local.eval_size={eval_size}", "rollout.num_rollout=64",
           "rollout.rollout_batch_size=8", f"++cluster.local.seed={seed}"]  # fmt: skip
    checked = {prompt_key(r) for r in env.demo_records(HELD_OUT_DEMOS, seed=HELD_OUT_SEED)}  # the largest monitor
    split = stage_records(env, local_session(tmp_path, *cfg).records)
    assert not checked & {prompt_key(r) for r in split.train + split.warm_start + split.validation}
    assert checked & {prompt_key(r) for r in env.demo_records(512 + 64, seed=seed)}  # they were in the draw
    MonitorSettings(demo_size=HELD_OUT_DEMOS)
    with pytest.raises(MonitorError, match="demo_size is at most"):
        MonitorSettings(demo_size=HELD_OUT_DEMOS + 1)
    asyncio.run(env.aclose())


def test_a_warm_started_stage_reports_base_warm_start_and_after(tmp_path):
    """The whole shape, small: base evaluated, SFT on gold demos, GRPO on the new backbone; the last line."""
    from aclarena_slime.launcher.stage import StageResult, finished_text
    from aclarena_slime.local.stage import run_stage

    cfg = [*MATH_STAGE, "++cluster.local.validation_size=2"]
    session = local_session(tmp_path, *cfg)
    paths = session.paths
    metrics = run_stage(session)
    warm = metrics["warm_start"]
    assert warm["demos"]["kept"] == 8 and warm["sft"]["nll_after"] < warm["sft"]["nll_before"]
    assert metrics["model_dir"] == warm["backbone"] == str(paths.warm_start_dir.resolve())
    adapter_config = json.loads((paths.adapter_dir / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == warm["backbone"]  # the expert sits on the new backbone
    assert {metrics[k]["n"] for k in ("eval_before", "eval_warm_start", "eval_after")} == {2}
    assert metrics["records"] == {
        "train": 2, "warm_start": 8, "validation": 2, "evaluation": 2, "overlap_dropped": 2, "held_out": True
    }  # fmt: skip  (2 drawn prompts are among the HELD_OUT_DEMOS a monitor may check)
    assert [(v["step"], v["n"]) for v in metrics["eval_validation"]] == [(0, 2), (1, 2)]  # before and after GRPO
    base, warm_reward, after = (metrics[k]["mean_reward"] for k in ("eval_before", "eval_warm_start", "eval_after"))
    line = finished_text(StageResult(0, "local", adapter=str(paths.adapter_dir), metrics=metrics))
    assert (
        line.splitlines()[-1]
        == f"held-out reward: base {base:.3f} -> warm start {warm_reward:.3f} -> trained {after:.3f}"
    )
    # A chained stage continuing this expert loads the backbone the expert was trained on.
    chained = local_session(tmp_path / "next", *LEARNABLE, "data.env=math",
                            f"++cluster.local.base_adapter={paths.adapter_dir}")  # fmt: skip
    assert chained.model.source == warm["backbone"]
    assert warm["cached"] is False

    # Another RL run in the same folder reuses the warm start (same settings and seed); a warm-start setting
    # changed is a new warm start.
    weights = paths.warm_start_dir / "model.safetensors"
    written = weights.stat().st_mtime_ns
    again = run_stage(local_session(tmp_path, *cfg, "rollout.num_rollout=2", "algorithm.lr=5e-3"))
    assert again["warm_start"]["cached"] is True and weights.stat().st_mtime_ns == written
    assert again["eval_before"] == metrics["eval_before"] and again["eval_warm_start"] == metrics["eval_warm_start"]
    assert again["warm_start"]["sft"] == warm["sft"]
    assert asyncio.run(cached_warm_start(local_session(tmp_path, *cfg, "++cluster.local.warm_start_lr=5e-3"))) is None
    grpo_only = local_session(tmp_path, *cfg, "rollout.num_steps_per_rollout=2")  # GRPO's
    assert grpo_only.policy.train.minibatches == 2 and asyncio.run(cached_warm_start(grpo_only)) is not None
    # validation_eval=false (the main command's profile): the validation prompts stay out of the RL records, not
    # evaluated; the run trains and evaluates exactly as the one that evaluated them.
    quiet = run_stage(local_session(tmp_path, *cfg, "++cluster.local.validation_eval=false"))
    assert "eval_validation" not in quiet and quiet["records"] == metrics["records"]
    # (the engine-vs-trainer log-prob gaps are float noise that may move with the engine's batches)
    drop = ("seconds", "logprob_mismatch", "parity_mean_abs", "parity_max_abs")
    untimed = [[{k: v for k, v in step.items() if k not in drop} for step in m["steps"]] for m in (quiet, metrics)]
    assert untimed[0] == untimed[1] and quiet["eval_after"] == metrics["eval_after"]


def test_a_warm_start_into_the_policy_trains_the_expert_and_leaves_the_model(tmp_path):
    """warm_start_target=policy (the arena's MLE): the SFT trains the LoRA expert; the backbone stays the one
    every other expert is served on."""
    from aclarena_slime.local.stage import run_stage

    cfg = [*MATH_STAGE, "++cluster.local.warm_start_target=policy"]
    session = local_session(tmp_path, *cfg)
    paths = session.paths
    metrics = run_stage(session)
    warm = metrics["warm_start"]
    assert warm["target"] == "policy" and warm["sft"]["nll_after"] < warm["sft"]["nll_before"]
    assert not paths.warm_start_dir.exists()  # no new backbone
    base = str((paths.output_dir / "base_model").resolve())
    assert metrics["model_dir"] == base
    assert json.loads((paths.adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"] == base
    assert {metrics[k]["n"] for k in ("eval_before", "eval_warm_start", "eval_after")} == {2}
    with pytest.raises(ValueError, match="warm_start_target"):
        local_recipe(tmp_path, *cfg, "++cluster.local.warm_start_target=adapter")


def test_the_local_profile_picks_the_stage_envs_demos_or_warns(tmp_path):
    from aclarena_slime.testing.local import REPO

    recipes = REPO / "recipes"
    search = local_session(tmp_path, recipe=recipes / "stage2_search.yaml")
    assert search.warm_start is not None and search.warm_start.demos == "aclarena_envs.search.data.demo_turns"
    assert search.warm_start.sft.steps > 0
    assert search.records.eval_size >= 32 and search.engine.budgets.max_response_len >= 200  # a search demo fits

    local = local_recipe(tmp_path, recipe=recipes / "stage3_retail.yaml").cluster.local
    assert local.warm_start_steps == 0 and local.warm_start_demos is None  # recipes/env/local/retail.yaml: no demos
    with pytest.warns(UserWarning, match="no warm_start_demos for env 'retail'"):
        retail = local_session(tmp_path, "cluster.local.warm_start_steps=5", recipe=recipes / "stage3_retail.yaml")
    assert retail.warm_start is None and retail.settings["local"]["warm_start_steps"] == 0
    with pytest.warns(UserWarning, match="continues base_adapter"):
        chained = local_session(tmp_path, "lora=r16_a32", f"++cluster.local.base_adapter={tmp_path}")
    assert chained.warm_start is None and chained.records.warm_start_records == 0


def test_search_demos_answer_only_what_the_retrieved_passage_shows(chat):
    """A gold answer the observation never showed teaches recall, not reading: such demos are dropped."""
    env = SearchEnvironment({"topk": 1})
    records = env.demo_records(40, seed=0)
    bridged = [r for r in records if r["prompt"].startswith("In which town was the founder")]
    # The founder's birthplace is in the founder's passage, which the question alone does not retrieve first.
    assert bridged and all(search_demo_turns(r) == [f"<search> {r['prompt']} </search>"] for r in bridged)
    examples, report = _replay(env, chat, records, search_demo_turns)
    assert report.kept == sum(len(search_demo_turns(r)) == 2 for r in records) >= len(records) // 2
    assert report.kept + report.not_completed + report.below_reward == len(records)
    for example in examples:
        untrained = chat.tokenizer.decode([t for t, m in zip(example.tokens, example.loss_mask, strict=True) if not m])
        trained = chat.tokenizer.decode([t for t, m in zip(example.tokens, example.loss_mask, strict=True) if m])
        answer = trained.split("<answer>")[1].split("</answer>")[0].strip()
        assert answer in untrained.split("<information>")[-1]  # the answer was in the passage the model read


def test_the_tiny_tokenizer_learns_the_warm_start_text_never_the_held_out_prompts(tmp_path):
    cfg = [*LEARNABLE, "data.env=search", "++cluster.local.eval_size=16", "rollout.num_rollout=1",
           "rollout.rollout_batch_size=2", "++cluster.local.warm_start_steps=1", "++cluster.local.warm_start_records=64",
           "++cluster.local.warm_start_demos=aclarena_envs.search.data.demo_turns"]  # fmt: skip
    session = local_session(tmp_path, *cfg)
    texts = asyncio.run(tokenizer_texts(session))
    env = SearchEnvironment({})
    split = stage_records(env, session.records)
    asyncio.run(env.aclose())
    assert {r["prompt"] for r in split.warm_start} <= set(texts)
    assert not {r["prompt"] for r in split.evaluation} & set(texts)
    plain, trained = build_tiny_tokenizer(), build_tiny_tokenizer(texts=texts)
    prompt = split.warm_start[0]["prompt"]
    assert len(trained.encode(prompt)) < len(plain.encode(prompt)) and trained.decode(trained.encode(prompt)) == prompt
    # No warm start, or a model of the user's: the tokenizer is the model's own.
    assert asyncio.run(tokenizer_texts(local_session(tmp_path, *cfg, "++cluster.local.warm_start_steps=0"))) == []
    assert asyncio.run(tokenizer_texts(local_session(tmp_path, *cfg, f"++cluster.local.model={tmp_path}"))) == []


def test_tiny_model_shape_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="tiny_hidden_size"):
        local_recipe(tmp_path, *LEARNABLE, "++cluster.local.tiny_hidden_size=66")
    with pytest.raises(ValueError, match="tiny_layers"):
        local_recipe(tmp_path, *LEARNABLE, "++cluster.local.tiny_layers=0")
    with pytest.raises(ValueError, match="vocab_size"):
        TinyShape(vocab_size=0)
