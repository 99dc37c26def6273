"""The reasoning_gym bridge with the real library: two tasks mixed by weight, the generator's answers score 1 through
the env, records repeat per seed, the scorer's failures are scores of 0 with a reason, the contract holds, and a
stage of it compiles for slime and runs on the local backend."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from aclarena_envs.reasoning_gym import data  # noqa: E402
from aclarena_envs.reasoning_gym.env import ReasoningGymEnvironment, extract_answer  # noqa: E402
from aclarena_slime.plugin.conformance import check_environment, check_hostile_outputs  # noqa: E402
from aclarena_slime.plugin.contract import Task  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
MIX = {"spell_backward": 1.0, "leg_counting": 1.0}


def env(**config) -> ReasoningGymEnvironment:
    return ReasoningGymEnvironment({"tasks": MIX, **config})


async def reward_of(environment: ReasoningGymEnvironment, record: dict, turn: str):
    episode = await environment.start(Task(**record))
    await episode.step(turn)
    return await episode.score()


async def test_the_generators_answers_score_one_and_wrong_answers_zero_on_both_tasks():
    environment = env()
    records = environment.demo_records(12, seed=5)
    assert {r["metadata"]["task"] for r in records} == set(MIX)
    for record in records:
        gold = await reward_of(environment, record, f"<think>hm</think>{data.demo_turns(record)[0]}")
        assert (gold.reward, gold.breakdown["entry"]) == (1.0, "generator"), gold
        wrong = await reward_of(environment, record, "<answer>zzzz</answer>")
        assert wrong.reward == 0.0
        untagged = await reward_of(environment, record, record["label"])
        assert untagged.reward == 0.0 and "no <answer>" in untagged.breakdown["reason"]


async def test_the_answer_in_the_thinking_does_not_count():
    record = env().demo_records(1)[0]
    score = await reward_of(env(), record, f"<answer>{record['label']}</answer></think>nothing")
    assert score.reward == 0.0
    assert extract_answer("<answer>a</answer> then <answer> b </answer>") == "b"


def test_records_repeat_per_seed_and_follow_the_weights():
    records = data.records({"spell_backward": 3.0, "leg_counting": 1.0}, 400, seed=1)
    assert records == data.records({"spell_backward": 3.0, "leg_counting": 1.0}, 400, seed=1)
    assert records != data.records({"spell_backward": 3.0, "leg_counting": 1.0}, 400, seed=2)
    share = sum(r["metadata"]["task"] == "spell_backward" for r in records) / len(records)
    assert 0.65 < share < 0.85
    assert all(r["metadata"]["env"] == "reasoning_gym" for r in records)
    assert len({r["prompt"] for r in records}) > 300


def test_two_seeds_draw_different_entries_not_one_sequence_shifted():
    """reasoning-gym seeds entry k of a dataset at ``seed + k``: seeds 0 and 1 would share all but one entry, and the
    arena's seeds (and a validation seed beside them) would evaluate the same prompts."""
    config = {"rotate_matrix": {"min_n": 3, "max_n": 3}}  # 10^9 matrices: a chance repeat is rare
    prompts = {seed: {r["prompt"] for r in data.records("rotate_matrix", 128, seed, config)} for seed in (0, 1, 100)}
    assert len(prompts[0] & prompts[1]) <= 1 and len(prompts[0] & prompts[100]) <= 1
    held_out = {r["prompt"] for r in data.records("rotate_matrix", 128, 10_007, config)}
    assert len({r["prompt"] for r in data.records("rotate_matrix", 2048, 0, config)} & held_out) <= 1
    assert len(data.records("pool_matrix", 4, seed=7)) == 4  # a task that seeds numpy with its seed plus the entry


async def test_a_record_whose_question_the_generator_no_longer_makes_is_scored_on_its_label():
    record = env().demo_records(1, seed=3)[0]
    record = {**record, "prompt": record["prompt"] + " (edited)"}
    score = await reward_of(env(), record, f"<answer>{record['label']}</answer>")
    assert (score.reward, score.breakdown["entry"]) == (1.0, "label")


async def test_a_scorer_that_raises_or_hangs_gives_zero_with_the_reason(monkeypatch):
    environment = env(score_timeout_s=0.2)
    record = next(r for r in environment.demo_records(8) if r["metadata"]["task"] == "leg_counting")
    generator = type(environment._entry(Task(**record), "leg_counting")[0])

    def broken(self, answer, entry):
        raise KeyError("metadata")

    monkeypatch.setattr(generator, "score_answer", broken)
    score = await reward_of(environment, record, f"<answer>{record['label']}</answer>")
    assert score.reward == 0.0 and score.breakdown["reason"] == "score_answer raised KeyError: 'metadata'"

    monkeypatch.setattr(generator, "score_answer", lambda self, answer, entry: time.sleep(1.0) or 1.0)
    started = time.monotonic()
    score = await reward_of(environment, record, f"<answer>{record['label']}</answer>")
    assert score.reward == 0.0 and "ran past 0.2 s" in score.breakdown["reason"]
    assert time.monotonic() - started < 0.9


async def test_an_overlong_answer_is_not_read():
    record = env().demo_records(1)[0]
    score = await reward_of(env(max_answer_chars=10), record, "<answer>" + "7" * 11 + "</answer>")
    assert score.reward == 0.0 and "longer than 10" in score.breakdown["reason"]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match=r"unknown task\(s\) \['no_such_task'\]"):
        ReasoningGymEnvironment({"tasks": "no_such_task"})
    with pytest.raises(ValueError, match=r"unknown config keys of the reasoning_gym env \['task'\]"):
        ReasoningGymEnvironment({"task": "spell_backward"})
    with pytest.raises(ValueError, match="positive weights"):
        ReasoningGymEnvironment({"tasks": {"spell_backward": 0}})
    with pytest.raises(ValueError, match="task_config names tasks not in tasks"):
        ReasoningGymEnvironment({"tasks": "spell_backward", "task_config": {"leg_counting": {}}})


async def test_task_config_reaches_the_generator_and_the_scorer():
    environment = ReasoningGymEnvironment({"tasks": "spell_backward", "task_config": {"spell_backward": {"min_word_len": 9, "max_word_len": 9}}})
    records = environment.demo_records(5)
    assert all(len(r["label"]) == 9 for r in records)
    assert (await reward_of(environment, records[0], f"<answer>{records[0]['label']}</answer>")).breakdown["entry"] == "generator"


async def test_conforms_and_survives_hostile_turns():
    environment = env()
    tasks = [Task(**r) for r in environment.demo_records(2, seed=1)]
    await check_environment(environment, tasks, [data.demo_turns(r)[0] for r in environment.demo_records(2, seed=1)])
    await check_hostile_outputs(environment, tasks[:1], examples=10)


def test_prepare_writes_the_records(tmp_path):
    out = tmp_path / "train.jsonl"
    assert data.main(["--output", str(out), "--task", "spell_backward:2", "--task", "leg_counting", "--n", "6"]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == data.records({"spell_backward": 2.0, "leg_counting": 1.0}, 6, 0)


def test_a_slime_stage_compiles(tmp_path, capsys):
    from aclarena_slime.launcher.stage import main

    assert main([str(REPO / "recipes" / "reasoning_gym.yaml"), "--dry-run", "backend=slime", f"paths.root={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "--custom-generate-function-path aclarena_slime.slime_edge.rollout.generate" in out
    assert f"{tmp_path}/data/reasoning_gym/train.jsonl" in out


@pytest.mark.slow
def test_a_local_stage_warm_starts_on_the_generators_answers_and_runs(tmp_path, capsys):
    from aclarena_slime.launcher.stage import main

    small = ["rollout.num_rollout=1", "rollout.rollout_batch_size=2", "rollout.n_samples_per_prompt=2",
             "cluster.local.eval_size=2", "++cluster.local.validation_size=0", "rollout.rollout_max_response_len=24",
             "cluster.local.warm_start_steps=2", "cluster.local.warm_start_records=8",
             "++env_config.reasoning_gym.tasks={spell_backward: 1, leg_counting: 1}"]  # fmt: skip
    recipe = REPO / "recipes" / "reasoning_gym.yaml"
    assert main([str(recipe), "cluster=local", f"paths.root={tmp_path}", *small]) == 0, capsys.readouterr().err
    metrics = json.loads((tmp_path / "runs" / "reasoning_gym" / "local" / "metrics.json").read_text())
    assert len(metrics["steps"]) == 1 and metrics["eval_after"]["prompts"] == 2
    demos = metrics["warm_start"]["demos"]  # replayed through the env: the task's own scorer gave each the full reward
    assert demos["replayed"] == demos["kept"] == 8 and demos["mean_reward"] == 1.0


def test_a_variant_tag_is_a_domain_of_its_own_in_one_process():
    from aclarena_slime.plugin.registry import get_environment

    spell = get_environment("reasoning_gym-spell_backward", {"tasks": "spell_backward"})
    words = get_environment("reasoning_gym-word_sorting", {"tasks": "word_sorting"})
    spelled, sorted_ = spell.demo_records(4, seed=0), words.demo_records(4, seed=0)
    assert {r["metadata"]["env"] for r in spelled} == {"reasoning_gym-spell_backward"}
    assert {r["metadata"]["env"] for r in sorted_} == {"reasoning_gym-word_sorting"}
    assert {r["metadata"]["task"] for r in sorted_} == {"word_sorting"}
    assert not {r["prompt"] for r in spelled} & {r["prompt"] for r in sorted_}
    assert get_environment("reasoning_gym", {"tasks": "spell_backward"}).demo_records(1)[0]["metadata"]["env"] == data.TAG


async def test_a_variants_records_score_through_the_variant():
    from aclarena_slime.plugin.registry import get_environment

    environment = get_environment("reasoning_gym-word_sorting", {"tasks": "word_sorting"})
    record = environment.demo_records(1, seed=3)[0]
    assert (await reward_of(environment, record, data.demo_turns(record)[0])).reward == 1.0
    await check_environment(environment, [Task(**record)], [data.demo_turns(record)[0]])  # the kit takes a variant


def test_prepare_under_a_variant_tag_writes_records_tagged_with_it(tmp_path, capsys):
    from aclarena_slime.cli import main

    out = tmp_path / "train.jsonl"
    argv = ["data", "prepare", "reasoning_gym-spell_backward", "--output", str(out), "--task", "spell_backward", "--n", "3"]
    assert main(argv) == 0, capsys.readouterr().err
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == data.records("spell_backward", 3, 0, tag="reasoning_gym-spell_backward")
    assert {r["metadata"]["env"] for r in written} == {"reasoning_gym-spell_backward"}


def test_a_slime_stage_of_a_variant_compiles_with_its_own_data_and_settings(tmp_path, capsys):
    from aclarena_slime.launcher.stage import main

    variant = "reasoning_gym-word_sorting"
    args = [str(REPO / "recipes" / "reasoning_gym.yaml"), "--dry-run", "backend=slime", f"paths.root={tmp_path}",
            f"data.env={variant}", f"++env_config.{variant}.tasks=word_sorting"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path}/data/{variant}/train.jsonl" in out and f"{tmp_path}/runs/{variant}/checkpoint" in out
    assert f'"adapter_name": "{variant}"' in out and f"on a LoRA expert named {variant}." in out
    settings = out[out.index(f'"{variant}": {{') :]  # the custom config the rollout reads: the variant's own section
    assert settings.index('"tasks": "word_sorting"') < settings.index("}")
