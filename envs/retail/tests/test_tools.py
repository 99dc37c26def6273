"""The 16 tools: τ³'s checks, messages and state changes; schemas generated from the code."""

from __future__ import annotations

import json

import pytest

from aclarena_envs.retail.data import RetailData
from aclarena_envs.retail.db import RetailDatabase, canonical_hash
from aclarena_envs.retail.reward import replay_gold
from aclarena_envs.retail.tools import TOOL_SPECS, WRITE_TOOLS, RetailTools, tool_schemas

ADDRESS = {
    "address1": "9 Elm St",
    "address2": "Apt 3",
    "city": "Austin",
    "state": "TX",
    "country": "USA",
    "zip": "73301",
}


@pytest.fixture
def tools(tiny_db) -> RetailTools:
    return RetailTools(RetailDatabase(tiny_db).fresh())


def call(tools: RetailTools, name: str, **arguments):
    return tools.call(name, arguments)


def test_sixteen_tools_with_generated_schemas():
    assert len(TOOL_SPECS) == 16
    assert WRITE_TOOLS == {
        "cancel_pending_order",
        "exchange_delivered_order_items",
        "modify_pending_order_address",
        "modify_pending_order_items",
        "modify_pending_order_payment",
        "modify_user_address",
        "return_delivered_order_items",
    }
    schemas = {s["function"]["name"]: s["function"] for s in tool_schemas()}
    exchange = schemas["exchange_delivered_order_items"]["parameters"]
    assert exchange["required"] == ["order_id", "item_ids", "new_item_ids", "payment_method_id"]
    assert exchange["properties"]["item_ids"]["type"] == "array"
    assert exchange["properties"]["item_ids"]["items"] == {"type": "string"}
    assert "'#'" in exchange["properties"]["order_id"]["description"]
    assert schemas["list_all_product_types"]["parameters"] == {"type": "object", "properties": {}, "required": []}
    assert all(s["description"] and "Args:" not in s["description"] for s in schemas.values())
    json.dumps(tool_schemas())


def test_lookups(tools):
    assert call(tools, "find_user_id_by_email", email="ANN@example.com").content == "ann_lee_1"
    assert (
        call(tools, "find_user_id_by_name_zip", first_name="bob", last_name="RAY", zip="22222").content == "bob_ray_2"
    )
    assert (
        call(tools, "find_user_id_by_name_zip", first_name="bob", last_name="ray", zip="11111").content
        == "Error: User not found"
    )
    order = json.loads(call(tools, "get_order_details", order_id="#W2").content)
    assert order["status"] == "delivered" and order["cancel_reason"] is None
    assert json.loads(call(tools, "get_item_details", item_id="I6").content)["price"] == 30.0
    assert call(tools, "get_item_details", item_id="P1").content == "Error: Item not found"
    assert call(tools, "get_product_details", product_id="I1").content == "Error: Product not found"
    assert json.loads(call(tools, "list_all_product_types").content) == {"Mug": "P2", "T-Shirt": "P1"}
    assert call(tools, "get_user_details", user_id="x").content == "Error: User not found"
    assert call(tools, "transfer_to_human_agents", summary="wants a human").content == "Transfer successful"


@pytest.mark.parametrize(
    ("expression", "expected"),
    [("2 + 2", "4.0"), ("10 / 3", "3.33"), ("(1.5 + 2) * 3", "10.5"), ("7 // 2", "3.0"), ("-2 ** 2", "-4.0")],
)
def test_calculate(tools, expression, expected):
    assert call(tools, "calculate", expression=expression).content == expected


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("import os", "Error: Invalid characters in expression"),
        ("1 / 0", "Error: division by zero"),
        ("2 +", "Error: invalid syntax"),
        ("9 ** 9 ** 9", "Error: Result too large"),
        ("()", "Error: Invalid expression"),
    ],
)
def test_calculate_refuses_without_eval(tools, expression, error):
    assert call(tools, "calculate", expression=expression).content.startswith(error)


def test_calculate_bounds_every_operation(tools):
    """A product of allowed powers was computed in full (``10**24999 * ...``: 8 s for 1 kB, a minute for
    200 factors) before ``float`` refused it; now each product is refused before it is computed."""
    assert call(tools, "calculate", expression="*".join(["10**2000"] * 10)).content == "Error: Result too large"
    assert call(tools, "calculate", expression="*".join(["10**24999"] * 40)).content == "Error: Result too large"
    assert call(tools, "calculate", expression="1" + "+1" * 1500).content.startswith("Error: Expression too long")
    assert call(tools, "calculate", expression="10**300 / 10**299").content == "10.0"  # big but bounded: as τ³


def test_cancel_refunds_gift_card_at_once(tools):
    out = call(tools, "cancel_pending_order", order_id="#W1", reason="ordered by mistake")
    order = json.loads(out.content)
    assert order["status"] == "cancelled" and order["cancel_reason"] == "ordered by mistake"
    assert order["payment_history"][-1] == {
        "transaction_type": "refund",
        "amount": 15.0,
        "payment_method_id": "gift_card_1",
    }
    assert tools.db["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 35.0


@pytest.mark.parametrize(
    ("name", "arguments", "error"),
    [
        (
            "cancel_pending_order",
            {"order_id": "#W2", "reason": "no longer needed"},
            "Non-pending order cannot be cancelled",
        ),
        ("cancel_pending_order", {"order_id": "#W1", "reason": "too expensive"}, "Invalid reason"),
        ("cancel_pending_order", {"order_id": "W1", "reason": "no longer needed"}, "Order not found"),
        (
            "exchange_delivered_order_items",
            {"order_id": "#W1", "item_ids": [], "new_item_ids": [], "payment_method_id": "paypal_1"},
            "Non-delivered order cannot be exchanged",
        ),
        (
            "exchange_delivered_order_items",
            {
                "order_id": "#W2",
                "item_ids": ["I2", "I2"],
                "new_item_ids": ["I1", "I1"],
                "payment_method_id": "paypal_1",
            },
            "Number of I2 not found.",
        ),
        (
            "exchange_delivered_order_items",
            {"order_id": "#W2", "item_ids": ["I2"], "new_item_ids": [], "payment_method_id": "paypal_1"},
            "The number of items to be exchanged should match.",
        ),
        (
            "exchange_delivered_order_items",
            {"order_id": "#W2", "item_ids": ["I2"], "new_item_ids": ["I3"], "payment_method_id": "paypal_1"},
            "New item I3 not found or available",
        ),
        (
            "exchange_delivered_order_items",
            {"order_id": "#W2", "item_ids": ["I2"], "new_item_ids": ["I4"], "payment_method_id": "paypal_1"},
            "Variant not found",
        ),
        (
            "exchange_delivered_order_items",
            {"order_id": "#W2", "item_ids": ["I2"], "new_item_ids": ["I1"], "payment_method_id": "paypal_2"},
            "Payment method not found",
        ),
        (
            "modify_pending_order_items",
            {"order_id": "#W4", "item_ids": ["I1"], "new_item_ids": ["I6"], "payment_method_id": "gift_card_2"},
            "Insufficient gift card balance to pay for the new item",
        ),
        (
            "modify_pending_order_items",
            {"order_id": "#W1", "item_ids": ["I1"], "new_item_ids": ["I1"], "payment_method_id": "paypal_1"},
            "The new item id should be different from the old item id",
        ),
        (
            "modify_pending_order_items",
            {"order_id": "#W1", "item_ids": ["I9"], "new_item_ids": ["I1"], "payment_method_id": "paypal_1"},
            "I9 not found",
        ),
        (
            "modify_pending_order_items",
            {"order_id": "#W1", "item_ids": ["I1"], "new_item_ids": ["I2", "I6"], "payment_method_id": "paypal_1"},
            "The number of items to be exchanged should match",
        ),
        (
            "modify_pending_order_payment",
            {"order_id": "#W1", "payment_method_id": "gift_card_1"},
            "The new payment method should be different from the current one",
        ),
        (
            "modify_pending_order_payment",
            {"order_id": "#W4", "payment_method_id": "gift_card_2"},
            "Insufficient gift card balance to pay for the order",
        ),
        (
            "modify_pending_order_payment",
            {"order_id": "#W3", "payment_method_id": "credit_card_1"},
            "Non-pending order cannot be modified",
        ),
        ("modify_pending_order_address", {"order_id": "#W2", **ADDRESS}, "Non-pending order cannot be modified"),
        (
            "return_delivered_order_items",
            {"order_id": "#W2", "item_ids": ["I2"], "payment_method_id": "paypal_1"},
            "Payment method should be the original payment method",
        ),
        (
            "return_delivered_order_items",
            {"order_id": "#W2", "item_ids": ["I1"], "payment_method_id": "credit_card_1"},
            "Some item not found",
        ),
        (
            "return_delivered_order_items",
            {"order_id": "#W3", "item_ids": ["I5"], "payment_method_id": "paypal_1"},
            "Non-delivered order cannot be returned",
        ),
        ("modify_user_address", {"user_id": "nobody", **ADDRESS}, "User not found"),
    ],
)
def test_refusals_match_tau3_and_change_nothing(tools, name, arguments, error):
    before = canonical_hash(tools.db)
    result = tools.call(name, arguments)
    assert result.error and result.content == f"Error: {error}"
    assert canonical_hash(tools.db) == before


def test_exchange_records_request_and_rounded_difference(tools):
    order = json.loads(
        call(
            tools,
            "exchange_delivered_order_items",
            order_id="#W2",
            item_ids=["I2"],
            new_item_ids=["I6"],
            payment_method_id="credit_card_1",
        ).content
    )
    assert order["status"] == "exchange requested"
    assert order["exchange_items"] == ["I2"] and order["exchange_new_items"] == ["I6"]
    assert order["exchange_price_difference"] == 17.5 and order["exchange_payment_method_id"] == "credit_card_1"
    assert order["items"][0]["item_id"] == "I2"  # nothing is swapped until the exchange happens


def test_modify_items_charges_gift_card_and_copies_last_variant_like_tau3(tools):
    order = json.loads(
        call(
            tools,
            "modify_pending_order_items",
            order_id="#W4",
            item_ids=["I1", "I1"],
            new_item_ids=["I2", "I6"],
            payment_method_id="paypal_2",
        ).content
    )
    assert order["status"] == "pending (item modified)"
    assert [i["item_id"] for i in order["items"]] == ["I2", "I6"]
    # τ³ gives every swapped item the price and options of the last new variant
    assert [i["price"] for i in order["items"]] == [30.0, 30.0]
    assert order["items"][0]["options"] == {"color": "black"}
    assert order["payment_history"][-1] == {
        "transaction_type": "payment",
        "amount": 22.5,
        "payment_method_id": "paypal_2",
    }
    result = call(
        tools,
        "modify_pending_order_items",
        order_id="#W4",
        item_ids=["I2"],
        new_item_ids=["I1"],
        payment_method_id="paypal_2",
    )
    assert result.content == "Error: Non-pending order cannot be modified"  # once per order


def test_modify_items_refund_goes_back_to_gift_card(tools):
    call(
        tools,
        "modify_pending_order_items",
        order_id="#W1",
        item_ids=["I4"],
        new_item_ids=["I5"],
        payment_method_id="gift_card_1",
    )
    assert tools.db["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 19.0
    call(
        tools, "modify_pending_order_address", order_id="#W1", **ADDRESS
    )  # "pending (item modified)" still counts as pending
    assert tools.db["orders"]["#W1"]["address"] == {
        k: ADDRESS[k] for k in ("address1", "address2", "city", "country", "state", "zip")
    }


def test_modify_payment_moves_the_charge(tools):
    order = json.loads(
        call(tools, "modify_pending_order_payment", order_id="#W1", payment_method_id="credit_card_1").content
    )
    assert [(p["transaction_type"], p["payment_method_id"]) for p in order["payment_history"]] == [
        ("payment", "gift_card_1"),
        ("payment", "credit_card_1"),
        ("refund", "gift_card_1"),
    ]
    assert tools.db["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 35.0
    again = call(tools, "modify_pending_order_payment", order_id="#W1", payment_method_id="paypal_1")
    assert again.content == "Error: There should be exactly one payment for a pending order"


def test_return_and_user_address(tools):
    order = json.loads(
        call(
            tools, "return_delivered_order_items", order_id="#W2", item_ids=["I2"], payment_method_id="gift_card_1"
        ).content
    )
    assert order["status"] == "return requested" and order["return_items"] == ["I2"]
    assert order["return_payment_method_id"] == "gift_card_1"
    user = json.loads(call(tools, "modify_user_address", user_id="bob_ray_2", **ADDRESS).content)
    assert user["address"]["city"] == "Austin"


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"order_id": "#W1"}, "missing argument(s) 'reason'"),
        ({"order_id": "#W1", "reason": "no longer needed", "force": True}, "unexpected argument(s) 'force'"),
        ({"order_id": 1, "reason": "no longer needed"}, "argument 'order_id' must be a string"),
    ],
)
def test_arguments_are_checked_against_the_signature(tools, arguments, error):
    result = tools.call("cancel_pending_order", arguments)
    assert result.error and error in result.content
    assert tools.db["orders"]["#W1"]["status"] == "pending"


def test_list_arguments_must_hold_strings(tools):
    result = tools.call(
        "return_delivered_order_items", {"order_id": "#W2", "item_ids": [2], "payment_method_id": "credit_card_1"}
    )
    assert "must be a list of strings" in result.content
    assert tools.call("no_such_tool", {}).content == "Error: Tool 'no_such_tool' not found."
    assert tools.call("get_user_details", ["ann_lee_1"]).error


# Final database hashes τ³'s own tools give after each task's gold actions (tau2-bench a2c0247,
# computed with their RetailTools in a scratch environment): one task per write tool, plus tasks
# where several items are swapped at once (τ³'s last-variant behaviour) and a refused gold action.
TAU3_GOLD_HASHES = {
    "0": "a109be174767fde0ebb50fe3be37cdb2f1ce017fefd7bd29ea3e4d38bd3ac25a",  # exchange
    "2": "9b66e83dbc00ef3e826a50a5a8b645ae06ba53cca06354b7d003a84a8af1d05a",  # return
    "3": "efb8b638945f19291aab0ccbc4cfd2c653e74bf7fbe3b11174379800a331979c",  # modify items
    "16": "76488acd2c5a18ade7bd3a32bc2fc5f6fdc5039223f86bc79f9754f3b5472a50",  # cancel
    "17": "582f5d9c8242800c8bd77208017d9074c34e8b69b8e0cbfc2cb464dd5f604f98",  # order address
    "20": "d43fdfd87998ef6d749f84282c5211231d0877a98ae6ade7864ab2790ed0120f",  # four items swapped
    "22": "dc23fc9e78321e7babc4657ac01ffac00fa37fea2a168a9a9a36d34aff154671",  # user address
    "40": "09f9be39b93d78b44f54e7e3a0806a6227c420fb4a2e5e4b97861c7a8ff5a24d",  # payment
    "100": "1af6e2cc79b3269e48afc34defd97506284156cbfc07926950dac9200855849c",  # two items swapped
    "105": "b25c9cb211f5efcaee5dd646054a73c4a9f43f4f5acc32c10713cd9f9ac20e9c",  # refused: balance too low
}


def test_gold_replays_end_in_the_states_tau3_reaches(real_data):
    data = RetailData.load(real_data)
    for task_id, expected in TAU3_GOLD_HASHES.items():
        assert replay_gold(data.db, data.task(task_id)).db_hash == expected, task_id
