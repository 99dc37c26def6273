"""Fixtures: a tiny τ³-shaped data directory built in-process, and the real data when it is present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# ../shared/data/tau3-retail next to the repository (τ³-bench's retail data; never committed here).
REAL_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "tau3-retail"


def _address(zip_code: str) -> dict:
    return {
        "address1": "1 Main St",
        "address2": "",
        "city": "Springfield",
        "country": "USA",
        "state": "IL",
        "zip": zip_code,
    }


def _order(order_id, user_id, status, items, payments, fulfilled=True):
    return {
        "order_id": order_id,
        "user_id": user_id,
        "address": _address("11111"),
        "items": items,
        "status": status,
        "fulfillments": [{"tracking_id": ["123"], "item_ids": [i["item_id"] for i in items]}] if fulfilled else [],
        "payment_history": [{"transaction_type": "payment", "amount": a, "payment_method_id": m} for a, m in payments],
    }


def _item(item_id, price, color, product=("T-Shirt", "P1")):
    return {
        "name": product[0],
        "product_id": product[1],
        "item_id": item_id,
        "price": price,
        "options": {"color": color},
    }


MUG = ("Mug", "P2")

TINY_DB = {
    "products": {
        "P1": {
            "name": "T-Shirt",
            "product_id": "P1",
            "variants": {
                "I1": {"item_id": "I1", "options": {"color": "blue"}, "available": True, "price": 10.0},
                "I2": {"item_id": "I2", "options": {"color": "red"}, "available": True, "price": 12.5},
                "I3": {"item_id": "I3", "options": {"color": "green"}, "available": False, "price": 11.0},
                "I6": {
                    "item_id": "I6",
                    "options": {"color": "black"},
                    "available": True,
                    "price": 30,
                },  # an int, as JSON may hold
            },
        },
        "P2": {
            "name": "Mug",
            "product_id": "P2",
            "variants": {
                "I4": {"item_id": "I4", "options": {"color": "white"}, "available": True, "price": 5.0},
                "I5": {"item_id": "I5", "options": {"color": "black"}, "available": True, "price": 6.0},
            },
        },
    },
    "users": {
        "ann_lee_1": {
            "user_id": "ann_lee_1",
            "name": {"first_name": "Ann", "last_name": "Lee"},
            "address": _address("11111"),
            "email": "ann@example.com",
            "payment_methods": {
                "gift_card_1": {"source": "gift_card", "id": "gift_card_1", "balance": 20.0},
                "credit_card_1": {"source": "credit_card", "id": "credit_card_1", "brand": "visa", "last_four": "1234"},
                "paypal_1": {"source": "paypal", "id": "paypal_1"},
            },
            "orders": ["#W1", "#W2", "#W3"],
        },
        "bob_ray_2": {
            "user_id": "bob_ray_2",
            "name": {"first_name": "Bob", "last_name": "Ray"},
            "address": _address("22222"),
            "email": "bob@example.com",
            "payment_methods": {
                "paypal_2": {"source": "paypal", "id": "paypal_2"},
                "gift_card_2": {"source": "gift_card", "id": "gift_card_2", "balance": 1.0},
            },
            "orders": ["#W4"],
        },
    },
    "orders": {
        "#W1": _order(
            "#W1",
            "ann_lee_1",
            "pending",
            [_item("I1", 10.0, "blue"), _item("I4", 5.0, "white", MUG)],
            [(15.0, "gift_card_1")],
            False,
        ),
        "#W2": _order("#W2", "ann_lee_1", "delivered", [_item("I2", 12.5, "red")], [(12.5, "credit_card_1")]),
        "#W3": _order("#W3", "ann_lee_1", "processed", [_item("I5", 6.0, "black", MUG)], [(6.0, "paypal_1")]),
        "#W4": _order(
            "#W4",
            "bob_ray_2",
            "pending",
            [_item("I1", 10.0, "blue"), _item("I1", 10.0, "blue")],
            [(20.0, "paypal_2")],
            False,
        ),
    },
}


def _task(task_id, actions, basis=("DB",), communicate=()):
    return {
        "id": task_id,
        "description": {"purpose": None},
        "user_scenario": {
            "persona": None,
            "instructions": {
                "domain": "retail",
                "reason_for_call": "You want to sort out an order.",
                "known_info": "You are Ann Lee, email ann@example.com.",
                "unknown_info": None,
                "task_instructions": "Be brief.",
            },
        },
        "initial_state": None,
        "evaluation_criteria": {
            "actions": [
                {"action_id": f"{task_id}_{i}", "name": n, "arguments": a, "info": None}
                for i, (n, a) in enumerate(actions)
            ],
            "communicate_info": list(communicate),
            "nl_assertions": ["Agent is polite."],
            "reward_basis": list(basis),
        },
    }


CANCEL_W1 = ("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"})
EXCHANGE_W2 = (
    "exchange_delivered_order_items",
    {"order_id": "#W2", "item_ids": ["I2"], "new_item_ids": ["I1"], "payment_method_id": "gift_card_1"},
)

TINY_TASKS = [
    _task(
        "t0",
        [
            ("find_user_id_by_email", {"email": "ann@example.com"}),
            ("get_order_details", {"order_id": "#W1"}),
            CANCEL_W1,
        ],
    ),
    _task("t1", [EXCHANGE_W2], basis=("DB", "COMMUNICATE"), communicate=["2.5"]),
    # a refused gold action (τ³'s data has some): it is skipped and changes nothing
    _task(
        "t2",
        [
            ("get_user_details", {"user_id": "nobody"}),
            ("modify_user_address", {"user_id": "bob_ray_2", **_address("33333")}),
        ],
    ),
]


def write_data_dir(root: Path, db: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "db.json").write_text(json.dumps(db if db is not None else TINY_DB))
    (root / "tasks.json").write_text(json.dumps(TINY_TASKS))
    (root / "split_tasks.json").write_text(
        json.dumps({"train": ["t0", "t2"], "test": ["t1"], "base": ["t0", "t1", "t2"]})
    )
    (root / "policy.md").write_text("# Tiny retail policy\n\nAuthenticate the user first.\n")
    return root


@pytest.fixture
def tiny_data(tmp_path: Path) -> Path:
    return write_data_dir(tmp_path / "tau3-retail")


@pytest.fixture(scope="session")
def real_data() -> Path:
    if not (REAL_DATA / "db.json").exists():
        pytest.skip(f"τ³-Retail data not found at {REAL_DATA} (../shared/data/tau3-retail next to the repository)")
    return REAL_DATA


@pytest.fixture
def make_data_dir(tmp_path: Path):
    """Build a data directory around a (modified) copy of the tiny database."""

    def make(db: dict) -> Path:
        return write_data_dir(tmp_path / "custom", db)

    return make


@pytest.fixture
def tiny_db() -> dict:
    return json.loads(json.dumps(TINY_DB))
