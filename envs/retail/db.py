"""The τ³-Retail database: loaded from the user's data directory, copied per episode, hashed like τ³.

τ³ (sierra-research/tau2-bench, ``src/tau2/domains/retail/data_model.py``) keeps the database as
pydantic models and hashes it as ``sha256(json.dumps(model_dump(), sort_keys=True, default=str))``
(``tau2/utils/utils.py:get_dict_hash``). To get the same digest from plain dicts we normalise what
``db.json`` holds the way validation does: every order carries its seven optional fields (``None``
unless set), float fields hold floats (``12`` becomes ``12.0``), keys the models do not declare are
dropped. Keys are written in the models' field order so tool outputs read like τ³'s.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

# Field specs: a type name, or a tuple: ("list", T), ("dict", T), ("model", fields), ("opt", T),
# ("literal", values), ("payment",). ``fields`` is a tuple of (name, spec, has_default).
_STR = "str"
_FLOAT = "float"
_BOOL = "bool"

_ADDRESS = ("model", tuple((k, _STR, False) for k in ("address1", "address2", "city", "country", "state", "zip")))
_STR_DICT = ("dict", _STR)
_STR_LIST = ("list", _STR)

_VARIANT = (
    "model",
    (("item_id", _STR, False), ("options", _STR_DICT, False), ("available", _BOOL, False), ("price", _FLOAT, False)),
)
_PRODUCT = ("model", (("name", _STR, False), ("product_id", _STR, False), ("variants", ("dict", _VARIANT), False)))

# Payment methods are a union told apart by ``source`` (pydantic picks the member whose literal matches).
PAYMENT_FIELDS: dict[str, tuple[str, ...]] = {
    "credit_card": ("source", "id", "brand", "last_four"),
    "gift_card": ("source", "id", "balance"),
    "paypal": ("source", "id"),
}

_USER = (
    "model",
    (
        ("user_id", _STR, False),
        ("name", ("model", (("first_name", _STR, False), ("last_name", _STR, False))), False),
        ("address", _ADDRESS, False),
        ("email", _STR, False),
        ("payment_methods", ("dict", ("payment",)), False),
        ("orders", _STR_LIST, False),
    ),
)

ORDER_STATUSES = (
    "processed",
    "pending",
    "pending (item modified)",
    "delivered",
    "cancelled",
    "exchange requested",
    "return requested",
)
CANCEL_REASONS = ("no longer needed", "ordered by mistake")

_ORDER_ITEM = (
    "model",
    (
        ("name", _STR, False),
        ("product_id", _STR, False),
        ("item_id", _STR, False),
        ("price", _FLOAT, False),
        ("options", _STR_DICT, False),
    ),
)
_PAYMENT = (
    "model",
    (
        ("transaction_type", ("literal", ("payment", "refund")), False),
        ("amount", _FLOAT, False),
        ("payment_method_id", _STR, False),
    ),
)
_ORDER = (
    "model",
    (
        ("order_id", _STR, False),
        ("user_id", _STR, False),
        ("address", _ADDRESS, False),
        ("items", ("list", _ORDER_ITEM), False),
        ("status", ("literal", ORDER_STATUSES), False),
        (
            "fulfillments",
            ("list", ("model", (("tracking_id", _STR_LIST, False), ("item_ids", _STR_LIST, False)))),
            False,
        ),
        ("payment_history", ("list", _PAYMENT), False),
        ("cancel_reason", ("opt", ("literal", CANCEL_REASONS)), True),
        ("exchange_items", ("opt", _STR_LIST), True),
        ("exchange_new_items", ("opt", _STR_LIST), True),
        ("exchange_payment_method_id", ("opt", _STR), True),
        ("exchange_price_difference", ("opt", _FLOAT), True),
        ("return_items", ("opt", _STR_LIST), True),
        ("return_payment_method_id", ("opt", _STR), True),
    ),
)
_TOP = (("products", ("dict", _PRODUCT)), ("users", ("dict", _USER)), ("orders", ("dict", _ORDER)))


class DatabaseError(ValueError):
    """``db.json`` does not have the shape of a τ³-Retail database; the message names the place."""


def _normalise(value: Any, spec: Any, where: str) -> Any:
    kind = spec if isinstance(spec, str) else spec[0]
    if kind == _STR:
        if not isinstance(value, str):
            raise DatabaseError(f"{where}: expected a string, got {value!r}")
        return value
    if kind == _FLOAT:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise DatabaseError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if kind == _BOOL:
        if not isinstance(value, bool):
            raise DatabaseError(f"{where}: expected true or false, got {value!r}")
        return value
    if kind == "literal":
        if value not in spec[1]:
            raise DatabaseError(f"{where}: {value!r} is not one of {list(spec[1])}")
        return value
    if kind == "opt":
        return None if value is None else _normalise(value, spec[1], where)
    if kind == "list":
        if not isinstance(value, list):
            raise DatabaseError(f"{where}: expected a list, got {type(value).__name__}")
        return [_normalise(v, spec[1], f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, dict):
        raise DatabaseError(f"{where}: expected an object, got {type(value).__name__}")
    if kind == "dict":
        return {_normalise(k, _STR, where): _normalise(v, spec[1], f"{where}[{k!r}]") for k, v in value.items()}
    if kind == "payment":
        source = value.get("source")
        if source not in PAYMENT_FIELDS:
            raise DatabaseError(f"{where}.source: {source!r} is not one of {list(PAYMENT_FIELDS)}")
        fields = tuple((k, _FLOAT if k == "balance" else _STR, False) for k in PAYMENT_FIELDS[source])
        return _normalise(value, ("model", fields), where)
    out = {}
    for name, field_spec, has_default in spec[1]:
        if name in value:
            out[name] = _normalise(value[name], field_spec, f"{where}.{name}")
        elif has_default:
            out[name] = None
        else:
            raise DatabaseError(f"{where}: missing field {name!r}")
    return out


def normalise(raw: Any) -> dict[str, Any]:
    """Validate a raw ``db.json`` object and return it in canonical form (see the module docstring)."""
    if not isinstance(raw, dict):
        raise DatabaseError(f"db.json: expected an object with {[k for k, _ in _TOP]}, got {type(raw).__name__}")
    extra = sorted(set(raw) - {k for k, _ in _TOP})
    if extra:  # τ³'s RetailDB forbids extra top-level keys
        raise DatabaseError(f"db.json: unexpected top-level keys {extra}")
    missing = [k for k, _ in _TOP if k not in raw]
    if missing:
        raise DatabaseError(f"db.json: missing top-level keys {missing}")
    return {name: _normalise(raw[name], spec, name) for name, spec in _TOP}


def canonical_hash(data: dict[str, Any]) -> str:
    """The digest τ³ computes for the same state: sha256 of the sorted-key JSON dump."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


class RetailDatabase:
    """The pristine database of one data directory; hands out independent copies for episodes.

    The pristine state is kept pickled: unpickling is the cheapest deep copy of nested dicts.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self._frozen = pickle.dumps(normalise(data), protocol=pickle.HIGHEST_PROTOCOL)
        self._hash: str | None = None

    @classmethod
    def load(cls, path: str | Path) -> RetailDatabase:
        """Read ``db.json`` (or ``<dir>/db.json``); a missing or malformed file raises ``DatabaseError``."""
        path = Path(path)
        if path.is_dir():
            path = path / "db.json"
        try:
            with path.open(encoding="utf-8") as fh:
                raw = json.load(fh)
        except FileNotFoundError as exc:
            raise DatabaseError(f"no retail database at {path}") from exc
        except json.JSONDecodeError as exc:
            raise DatabaseError(f"{path} is not valid JSON: {exc}") from exc
        return cls(raw)

    def fresh(self) -> dict[str, Any]:
        """An independent copy of the pristine state, for one episode to mutate."""
        return pickle.loads(self._frozen)

    @property
    def hash(self) -> str:
        """The canonical hash of the pristine state."""
        if self._hash is None:
            self._hash = canonical_hash(self.fresh())
        return self._hash
