"""The database: canonical form, per-episode copies, and a hash equal to τ³'s."""

from __future__ import annotations

import json

import pytest

from aclarena_envs.retail.db import DatabaseError, RetailDatabase, canonical_hash, normalise

# τ³'s own ``RetailDB.load(db.json).get_hash()`` on the shipped data (tau2-bench a2c0247, computed
# with their data model in a scratch environment).
TAU3_UNTOUCHED_HASH = "b25c9cb211f5efcaee5dd646054a73c4a9f43f4f5acc32c10713cd9f9ac20e9c"


def test_untouched_real_database_hashes_like_tau3(real_data):
    assert RetailDatabase.load(real_data).hash == TAU3_UNTOUCHED_HASH


def test_normalise_fills_defaults_coerces_floats_and_drops_unknown_keys(tiny_db):
    tiny_db["products"]["P1"]["variants"]["I1"]["warehouse"] = "B7"  # not in τ³'s model: dropped
    data = normalise(tiny_db)
    assert data["products"]["P1"]["variants"]["I6"]["price"] == 30.0
    assert isinstance(data["products"]["P1"]["variants"]["I6"]["price"], float)
    assert "warehouse" not in data["products"]["P1"]["variants"]["I1"]
    order = data["orders"]["#W1"]
    assert (
        order["cancel_reason"] is None and order["exchange_price_difference"] is None and order["return_items"] is None
    )
    assert list(order)[:7] == ["order_id", "user_id", "address", "items", "status", "fulfillments", "payment_history"]
    # the dump τ³ would hash: ``30`` and ``30.0`` differ in JSON, so coercion matters for the digest
    assert '"price": 30.0' in json.dumps(data["products"]["P1"]["variants"]["I6"])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda db: db["orders"]["#W1"].update(status="lost"), "orders['#W1'].status: 'lost' is not one of"),
        (lambda db: db["users"]["ann_lee_1"].pop("email"), "users['ann_lee_1']: missing field 'email'"),
        (lambda db: db["products"]["P1"]["variants"]["I1"].update(price="ten"), "price: expected a number"),
        (lambda db: db["users"]["ann_lee_1"]["payment_methods"]["paypal_1"].update(source="cash"), "source: 'cash'"),
        (lambda db: db.update(shops={}), "unexpected top-level keys ['shops']"),
        (lambda db: db.pop("orders"), "missing top-level keys ['orders']"),
    ],
)
def test_malformed_database_is_refused_with_the_place_named(tiny_db, mutate, message):
    mutate(tiny_db)
    with pytest.raises(DatabaseError, match=message.replace("[", r"\[").replace("(", r"\(")):
        RetailDatabase(tiny_db)


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(DatabaseError, match="no retail database"):
        RetailDatabase.load(tmp_path)
    (tmp_path / "db.json").write_text("{not json")
    with pytest.raises(DatabaseError, match="not valid JSON"):
        RetailDatabase.load(tmp_path)


def test_fresh_copies_are_independent_and_hash_tracks_state(tiny_db):
    db = RetailDatabase(tiny_db)
    a, b = db.fresh(), db.fresh()
    assert canonical_hash(a) == canonical_hash(b) == db.hash
    a["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] = 0.0
    assert canonical_hash(a) != db.hash
    assert canonical_hash(b) == db.hash == canonical_hash(db.fresh())


def test_hash_ignores_key_order(tiny_db):
    data = normalise(tiny_db)
    reordered = {k: dict(reversed(list(v.items()))) for k, v in reversed(list(data.items()))}
    assert canonical_hash(reordered) == canonical_hash(data)
