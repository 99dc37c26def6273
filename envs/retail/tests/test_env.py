"""Episodes, the reward, the gold replay (CLI included) and data preparation."""

from __future__ import annotations

import json

import pytest

from aclarena_envs.retail.data import RetailData, main, records
from aclarena_envs.retail.env import RetailEnvironment
from aclarena_envs.retail.gold import gold_environment, play_gold, tool_call_text
from aclarena_envs.retail.user_sim import ScriptedUser, UserSession, UserSimulator
from aclarena_slime.cli import main as cli_main
from aclarena_slime.plugin.conformance import check_environment, check_hostile_outputs
from aclarena_slime.plugin.contract import Done, EpisodeAborted, Observation, Task


def task(task_id: str) -> Task:
    return Task(prompt=f"tau3-retail task {task_id}", label=task_id, metadata={"env": "retail", "task_id": task_id})


def call(name: str, **arguments) -> str:
    return tool_call_text({"name": name, "arguments": arguments})


def env_with(tiny_data, replies) -> RetailEnvironment:
    return RetailEnvironment({"data_dir": str(tiny_data), "user": {"kind": "scripted", "replies": replies}})


async def test_episode_plays_tools_and_customer_and_scores(tiny_data):
    env = env_with(tiny_data, ["Hi, cancel #W1 please, I no longer need it.", "Yes, go ahead.", "Thanks! ###STOP###"])
    episode = await env.start(task("t0"))
    system, first = episode.conversation.messages
    assert system["role"] == "system" and "Tiny retail policy" in system["content"]
    assert first == {"role": "user", "content": "Hi, cancel #W1 please, I no longer need it."}
    assert len(episode.conversation.tools) == 16

    obs = await episode.step("<think>look up</think>" + call("find_user_id_by_email", email="ann@example.com"))
    assert obs.messages == [{"role": "tool", "name": "find_user_id_by_email", "content": "ann_lee_1"}]
    obs = await episode.step("I will cancel order #W1 (reason: no longer needed). Confirm?")
    assert obs.messages == [{"role": "user", "content": "Yes, go ahead."}]
    obs = await episode.step(call("cancel_pending_order", order_id="#W1", reason="no longer needed"))
    assert json.loads(obs.messages[0]["content"])["status"] == "cancelled"
    assert await episode.step("Done: #W1 is cancelled.") == Done("user_stop")

    score = await episode.score()
    assert score.reward == 1.0
    assert score.breakdown["db"]["match"] and score.breakdown["end"] == "user_stop"
    assert score.breakdown["not_evaluated"] == [] and score.breakdown["nl_assertions"] == {
        "count": 1,
        "evaluated": False,
    }
    assert env.user.replies  # the env built its scripted customer from config


async def test_wrong_or_missing_write_scores_zero(tiny_data):
    env = env_with(tiny_data, ["Cancel #W1."])
    wrong = await env.start(task("t0"))
    await wrong.step(call("cancel_pending_order", order_id="#W1", reason="ordered by mistake"))
    assert (await wrong.score()).reward == 0.0
    idle = await env.start(task("t0"))
    assert await idle.step("Bye.") == Done("user_stop")
    breakdown = (await idle.score()).breakdown
    assert breakdown["db"]["match"] is False and breakdown["db"]["agent_hash"] == env.data.db.hash


async def test_communicate_check_when_the_basis_asks(tiny_data):
    env = env_with(tiny_data, ["Exchange my red shirt for the blue one, gift card."])
    exchange = call(
        "exchange_delivered_order_items",
        order_id="#W2",
        item_ids=["I2"],
        new_item_ids=["I1"],
        payment_method_id="gift_card_1",
    )
    silent = await env.start(task("t1"))
    await silent.step(exchange)
    score = await silent.score()
    assert score.reward == 0.0 and score.breakdown["db"]["match"] and not score.breakdown["communicate"]["met"]
    told = await env.start(task("t1"))
    await told.step(exchange)
    await told.step("Done. You get $2,5 back... I mean 2.5 dollars.")
    assert (await told.score()).reward == 1.0


async def test_malformed_turns_are_observations_and_touch_nothing(tiny_data):
    env = env_with(tiny_data, ["Hello"])
    episode = await env.start(task("t0"))
    for text in [
        "<tool_call>{oops</tool_call>",
        '<tool_call>{"name": "drop_database", "arguments": {}}</tool_call>',
        call("cancel_pending_order", order_id=["#W1"], reason="no longer needed"),
        call("cancel_pending_order", order_id="#W1", reason="no longer needed", refund=False),
        "<tool_call>" + '{"name": "cancel_pending_order"',
    ]:
        obs = await episode.step(text)
        assert isinstance(obs, Observation) and obs.messages[0]["role"] == "tool"
        assert obs.messages[0]["content"].startswith("Error: ")
    assert episode.db_hash() == env.data.db.hash and not episode.wrote


async def test_turn_limit_and_gold_cache(tiny_data):
    env = RetailEnvironment(
        {"data_dir": str(tiny_data), "max_turns": 3, "user": {"kind": "scripted", "replies": ["x"]}}
    )
    assert env.max_turns == 3
    episode = await env.start(task("t2"))
    score = await episode.score()
    assert score.breakdown["end"] == "turn_limit" and score.reward == 0.0
    assert env.gold(env.data.task("t2")) is env.gold(env.data.task("t2"))


class _BrokenUser(UserSimulator):
    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at

    def session(self, scenario: str) -> UserSession:
        sim = self

        class Session(UserSession):
            calls = 0

            async def reply(self, agent_text: str) -> str:
                self.calls += 1
                if self.calls > sim.fail_at:
                    raise EpisodeAborted("user simulator timed out")
                return "hello"

        return Session()


async def test_simulator_failure_aborts_at_start_and_mid_episode(tiny_data):
    with pytest.raises(EpisodeAborted):
        await RetailEnvironment({"data_dir": str(tiny_data)}, user_simulator=_BrokenUser(0)).start(task("t0"))
    episode = await RetailEnvironment({"data_dir": str(tiny_data)}, user_simulator=_BrokenUser(1)).start(task("t0"))
    with pytest.raises(EpisodeAborted, match="timed out"):
        await episode.step("How can I help?")


async def test_customer_who_stops_at_once_ends_the_episode(tiny_data):
    episode = await env_with(tiny_data, ["###OUT-OF-SCOPE###"]).start(task("t0"))
    assert await episode.step("Hello?") == Done("user_out_of_scope")


async def test_caps_on_a_turn_are_answers_and_bound_the_work(tiny_data):
    """One 616 kB turn made 26,798 tool messages; a turn past the caps is answered, never an error."""
    env = RetailEnvironment(
        {"data_dir": str(tiny_data), "user": {"kind": "scripted", "replies": ["hi"]}, "max_turn_chars": 10_000}
    )
    episode = await env.start(task("t0"))
    lookup = call("get_user_details", user_id="ann_lee_1")
    obs = await episode.step(lookup * 40)
    assert len(obs.messages) == 17 and "at most 16 tool calls per turn; 24 more" in obs.messages[-1]["content"]
    obs = await episode.step(lookup * 1000)
    assert len(obs.messages) == 1 and "over 10000; nothing was run or sent" in obs.messages[0]["content"]
    long_id = "I" + "9" * 5000
    obs = await episode.step(
        call(
            "modify_pending_order_items",
            order_id="#W1",
            item_ids=[long_id],
            new_item_ids=["I2"],
            payment_method_id="gift_card_1",
        )
    )
    assert len(obs.messages[0]["content"]) == 1000  # the refusal echoed the argument: cut
    assert episode.agent_messages == [] and not episode.wrote


async def test_conformance_kit(tiny_data):
    await check_environment(
        env_with(tiny_data, ["hi", "ok"]),
        [task("t0"), task("t1")],
        turns=[call("get_user_details", user_id="ann_lee_1")],
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "needs data_dir"),
        ({"data_dir": "/nonexistent/retail"}, "does not exist"),
        ({"data_dir": "x", "max_turn": 3}, "unknown settings"),
        ({"data_dir": "x", "max_tool_calls": 0}, "max_tool_calls must be a positive integer"),
    ],
)
def test_config_errors(config, message):
    with pytest.raises(ValueError, match=message):
        RetailEnvironment(config, user_simulator=ScriptedUser([]))


async def test_unknown_task_fails_clearly(tiny_data):
    with pytest.raises(ValueError, match="no task 'nope'"):
        await env_with(tiny_data, []).start(task("nope"))


async def test_gold_play_and_one_extra_write(tiny_data):
    data = RetailData.load(tiny_data)
    env = gold_environment(data)
    played = {t: await play_gold(env, data.task(t)) for t in ("t0", "t1", "t2")}
    assert all(p.score.reward == 1.0 for p in played.values())
    assert played["t2"].errors == ["t2_0: Error: User not found"]
    # the gold actions plus one extra successful write: reward 0
    episode = await env.start(task("t0"))
    for action in data.task("t0")["evaluation_criteria"]["actions"]:
        await episode.step(tool_call_text(action))
    await episode.step(
        call(
            "modify_user_address",
            user_id="bob_ray_2",
            address1="2 Oak St",
            address2="",
            city="Reno",
            state="NV",
            country="USA",
            zip="89501",
        )
    )
    assert (await episode.score()).reward == 0.0


@pytest.mark.slow
def test_replay_gold_cli_on_real_data(real_data, capsys):
    """Done-when of issue 4: reward 1.0 on all 114 tasks of the base split (runs ~15 s on 2 cores)."""
    assert cli_main(["retail", "replay-gold", "--data", str(real_data), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 114 and all(r["reward"] == 1.0 for r in rows)
    assert {r["task_id"] for r in rows} == {str(i) for i in range(114)}
    assert all(len(r["db_hash"]) == 64 for r in rows)


async def test_extra_write_after_gold_scores_zero_on_real_tasks(real_data):
    data = RetailData.load(real_data)
    env = gold_environment(data)
    for task_id in ("0", "16", "40"):
        episode = await env.start(task(task_id))
        for action in data.task(task_id)["evaluation_criteria"]["actions"]:
            await episode.step(tool_call_text(action))
        assert (await episode.score()).reward == 1.0, task_id
        extra = await episode.step(
            call(
                "modify_user_address",
                user_id="noah_brown_6181",
                address1="1 New Rd",
                address2="",
                city="Reno",
                state="NV",
                country="USA",
                zip="89501",
            )
        )
        assert not extra.messages[0]["content"].startswith("Error")
        assert (await episode.score()).reward == 0.0, task_id


def test_replay_gold_cli_table_and_errors(tiny_data, capsys):
    assert cli_main(["retail", "replay-gold", "--data", str(tiny_data), "--split", "test"]) == 0
    out = capsys.readouterr().out
    assert "reward 1.0 on 1/1 tasks" in out and RetailData.load(tiny_data).db.hash in out
    assert cli_main(["retail", "replay-gold", "--data", str(tiny_data), "--split", "dev"]) == 2
    assert "no split 'dev'" in capsys.readouterr().err


def test_prepare_data_writes_slime_records(tiny_data, tmp_path, capsys):
    out = tmp_path / "train.jsonl"
    assert main(["--data", str(tiny_data), "--split", "train", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == records(RetailData.load(tiny_data), "train")
    assert rows[0] == {
        "prompt": "tau3-retail task t0",
        "label": "t0",
        "metadata": {"env": "retail", "task_id": "t0", "split": "train"},
    }
    assert main(["--data", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_demo_records_come_from_the_train_split(tiny_data):
    rows = env_with(tiny_data, []).demo_records(5, seed=1)
    assert sorted(r["label"] for r in rows) == ["t0", "t2"]


async def test_survives_hostile_turns(tiny_data):
    env = env_with(tiny_data, ["hi"] * 1000)
    await check_hostile_outputs(env, [task("t0")])


@pytest.mark.parametrize("label, says", [("no_such_task", "no task 'no_such_task'"), ({"id": "t0"}, "task id")])
def test_check_label_refuses_a_label_naming_no_task(tiny_data, label, says):
    """A label naming no task of the data directory fails where the data is read, not when its record is drawn;
    no label at all is fine (``metadata.task_id`` may name the task)."""
    env = env_with(tiny_data, ["hi"])
    with pytest.raises(ValueError, match=says):
        env.check_label(label)
    env.check_label("t0")
    env.check_label(None)
