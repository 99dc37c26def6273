"""Thousands of malformed tool calls: no exception escapes and a refused call never changes the database."""

from __future__ import annotations

import asyncio
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aclarena_envs.retail.db import canonical_hash
from aclarena_envs.retail.env import RetailEnvironment
from aclarena_envs.retail.tools import TOOL_SPECS, WRITE_TOOLS
from aclarena_slime.plugin.contract import Observation, Task

ORDERS = ["#W1", "#W2", "#W3", "#W4", "W1"]
ITEMS = ["I1", "I2", "I3", "I4", "I5", "I6", "P1"]
POOLS = {  # ids the tiny database knows (and a few it does not), by parameter name
    "order_id": ORDERS,
    "item_ids": ITEMS,
    "new_item_ids": ITEMS,
    "item_id": ITEMS,
    "product_id": ["P1", "P2", "I1"],
    "user_id": ["ann_lee_1", "bob_ray_2", "nobody"],
    "payment_method_id": ["gift_card_1", "gift_card_2", "credit_card_1", "paypal_1", "paypal_2", "gift_card_9"],
    "reason": ["no longer needed", "ordered by mistake", "other"],
    "email": ["ann@example.com", "BOB@example.com", "x@y"],
    "expression": ["1 + 2", "2 ** 2 ** 2 ** 2 ** 2", "1 / 0", "(3", "9.5 * 2"],
}
IDS = sorted({v for pool in POOLS.values() for v in pool} | {""})

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8) | st.sampled_from(IDS),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=8,
)


def plausible(param: str, annotation: object) -> st.SearchStrategy:
    """A well-typed value, mostly from the parameter's own pool, to get past the checks to the semantics."""
    values = st.sampled_from(POOLS.get(param, IDS)) | st.sampled_from(IDS)
    return values if annotation is str else st.lists(values, max_size=3)


@st.composite
def arguments(draw, name: str) -> dict:
    """Mostly well-typed arguments (to reach the deep checks), with wrong types, gaps and extras."""
    params = TOOL_SPECS[name].params if name in TOOL_SPECS else {}
    # (hypothesis leans to small draws: 0 picks the well-formed path, rare high values break things)
    args = {
        p: draw(json_values if draw(st.integers(0, 5)) == 5 else plausible(p, anno))
        for p, anno in params.items()
        if draw(st.integers(0, 19)) < 19
    }
    if draw(st.integers(0, 4)) == 4:
        args[draw(st.text(max_size=6))] = draw(json_values)
    return args


ADDRESS = {"address1": "2 Oak St", "address2": "", "city": "Reno", "state": "NV", "country": "USA", "zip": "89501"}
VALID_WRITES = [  # writes that succeed on the untouched tiny database, so later calls meet changed states
    ("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"}),
    (
        "modify_pending_order_items",
        {"order_id": "#W4", "item_ids": ["I1"], "new_item_ids": ["I2"], "payment_method_id": "paypal_2"},
    ),
    ("modify_pending_order_payment", {"order_id": "#W1", "payment_method_id": "credit_card_1"}),
    ("modify_pending_order_address", {"order_id": "#W4", **ADDRESS}),
    (
        "exchange_delivered_order_items",
        {"order_id": "#W2", "item_ids": ["I2"], "new_item_ids": ["I6"], "payment_method_id": "gift_card_1"},
    ),
    ("return_delivered_order_items", {"order_id": "#W2", "item_ids": ["I2"], "payment_method_id": "credit_card_1"}),
    ("modify_user_address", {"user_id": "ann_lee_1", **ADDRESS}),
]


@st.composite
def tool_call_texts(draw) -> str:
    if draw(st.integers(0, 3)) == 3:
        name, args = draw(st.sampled_from(VALID_WRITES))
        return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
    name = draw(st.sampled_from([*TOOL_SPECS, "", "nope", "get_user", "Calculate"]))
    body = {"name": name, "arguments": draw(arguments(name))}
    if draw(st.booleans()):
        body["arguments"] = json.dumps(body["arguments"])  # arguments as a JSON string, OpenAI style
    text = json.dumps(body)
    damage = draw(st.integers(0, 7))
    if damage == 1:
        text = text[: draw(st.integers(0, len(text)))]  # cut short
    elif damage == 2:
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(max_size=5)) + text[at:]  # junk spliced in
    elif damage == 3:
        text = json.dumps(draw(json_values))  # not a call at all
    close = "" if draw(st.integers(0, 19)) == 19 else "</tool_call>"
    return f"{draw(st.text(max_size=10))}<tool_call>{text}{close}"


def _run(env: RetailEnvironment, loop: asyncio.AbstractEventLoop, turns: list[str]) -> None:
    episode = loop.run_until_complete(env.start(Task("t", "t0", {"env": "retail", "task_id": "t0"})))
    for text in turns:
        before = canonical_hash(episode.tools.db)
        result = loop.run_until_complete(episode.step(text))
        assert isinstance(result, Observation)
        for message in result.messages:
            assert message["role"] == "tool" and isinstance(message["content"], str)
            refused = message["content"].startswith("Error: ")
            if refused or message.get("name") not in WRITE_TOOLS:
                assert canonical_hash(episode.tools.db) == before, message
            before = canonical_hash(episode.tools.db)
    loop.run_until_complete(episode.score())


def test_fuzzed_tool_calls_never_raise_and_refusals_change_nothing(tiny_data):
    env = RetailEnvironment({"data_dir": str(tiny_data), "user": {"kind": "scripted", "replies": ["hi"]}})
    loop = asyncio.new_event_loop()

    @settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(tool_call_texts(), min_size=1, max_size=5))
    def check(turns: list[str]) -> None:
        _run(env, loop, turns)

    try:
        check()
    finally:
        loop.close()


def test_fuzzed_free_text_never_raises(tiny_data):
    env = RetailEnvironment({"data_dir": str(tiny_data), "user": {"kind": "scripted", "replies": ["hi"] * 3}})
    loop = asyncio.new_event_loop()
    markup = st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", '"name"', "###STOP###"])

    @settings(max_examples=500, deadline=None)
    @given(st.lists(st.text(max_size=30) | markup, max_size=12).map("".join))
    def check(text: str) -> None:
        episode = loop.run_until_complete(env.start(Task("t", "t0", {"env": "retail", "task_id": "t0"})))
        loop.run_until_complete(episode.step(text))
        assert episode.db_hash() == env.data.db.hash  # free text cannot write

    try:
        check()
    finally:
        loop.close()
