"""The 16 τ³-Retail tools, our implementation over the plain-dict database of :mod:`.db`.

Semantics follow τ³ (sierra-research/tau2-bench, ``src/tau2/domains/retail/tools.py``): the same
checks in the same order with the same error messages, the same state changes, the same output
(``json.dumps`` of the object in field order, or the plain string). One deliberate difference: every
check runs before the first write, so a refused call never leaves the database half-changed (τ³
looks up a payment method after it has already written in two places; with the τ³ data those
look-ups never fail, so the resulting states agree).

The docstrings are the descriptions the model sees: :mod:`.tool_spec` turns them into schemas.
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aclarena_envs.retail.tool_spec import ToolSpec, is_tool, tool

GIFT_CARD = "gift_card"


class ToolError(ValueError):
    """A refused call; the model sees ``Error: <message>`` as the tool's answer."""


@dataclass(frozen=True)
class ToolResult:
    """The text the model sees for one call, and whether the call was refused."""

    content: str
    error: bool = False


_ARITHMETIC: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


# Integer work in ``calculate`` stays small whatever the model writes: no intermediate integer may pass
# this many bits (far beyond any price; ``float`` overflows past 1,024 bits anyway), and an expression
# may have at most ``MAX_EXPRESSION_CHARS`` characters, so the whole evaluation is a few milliseconds.
MAX_INT_BITS = 10_000
MAX_EXPRESSION_CHARS = 2_000


def _too_large(op: ast.operator, left: int | float, right: int | float) -> bool:
    """Whether the integer ``left op right`` could pass ``MAX_INT_BITS``, judged before computing it."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return False  # float arithmetic is constant time (and overflows by itself)
    if isinstance(op, ast.Pow):
        return right > 0 and abs(left) > 1 and left.bit_length() * right > MAX_INT_BITS
    if isinstance(op, ast.Mult):
        return left.bit_length() + right.bit_length() > MAX_INT_BITS + 1
    return max(left.bit_length(), right.bit_length()) >= MAX_INT_BITS  # +, -, //: at most one bit more


def _arithmetic(node: ast.AST) -> int | float:
    """Evaluate the arithmetic τ³'s ``calculate`` accepts (it calls ``eval``) without ``eval``.

    Every operation is bounded before it runs: a product of allowed powers (``10**2000 * 10**2000 * ...``)
    is refused like ``9**9**9``, instead of stalling the rollout for minutes.
    """
    if isinstance(node, ast.Expression):
        return _arithmetic(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, int) and node.value.bit_length() > MAX_INT_BITS:
            raise ToolError("Result too large")
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _ARITHMETIC:
        return _ARITHMETIC[type(node.op)](_arithmetic(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _arithmetic(node.left), _arithmetic(node.right)
        if _too_large(node.op, left, right):
            raise ToolError("Result too large")
        return _ARITHMETIC[type(node.op)](left, right)
    raise ToolError("Invalid expression")


class RetailTools:
    """The tools of one episode, acting on that episode's database (a dict from ``RetailDatabase.fresh``)."""

    def __init__(self, db: dict[str, Any]) -> None:
        self.db = db

    # ---- look-ups shared by the tools (not tools themselves) ----

    def _order(self, order_id: str) -> dict[str, Any]:
        if order_id not in self.db["orders"]:
            raise ToolError("Order not found")
        return self.db["orders"][order_id]

    def _user(self, user_id: str) -> dict[str, Any]:
        if user_id not in self.db["users"]:
            raise ToolError("User not found")
        return self.db["users"][user_id]

    def _product(self, product_id: str) -> dict[str, Any]:
        if product_id not in self.db["products"]:
            raise ToolError("Product not found")
        return self.db["products"][product_id]

    def _variant(self, product_id: str, item_id: str) -> dict[str, Any]:
        product = self._product(product_id)
        if item_id not in product["variants"]:
            raise ToolError("Variant not found")
        return product["variants"][item_id]

    def _payment_method(self, user_id: str, payment_method_id: str) -> dict[str, Any]:
        methods = self._user(user_id)["payment_methods"]
        if payment_method_id not in methods:
            raise ToolError("Payment method not found")
        return methods[payment_method_id]

    def _check_counts(self, order: dict[str, Any], item_ids: list[str], message: Callable[[str], str]) -> None:
        """Each id may be named at most as often as the order holds it."""
        held = [item["item_id"] for item in order["items"]]
        for item_id in item_ids:
            if item_ids.count(item_id) > held.count(item_id):
                raise ToolError(message(item_id))

    def _price_changes(
        self, order: dict[str, Any], item_ids: list[str], new_item_ids: list[str], *, distinct: bool
    ) -> tuple[float, dict[str, Any] | None]:
        """Sum of new minus old prices, and the last new variant; refuses unknown or unavailable items."""
        diff: float = 0
        variant = None
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
            if distinct and item_id == new_item_id:
                raise ToolError("The new item id should be different from the old item id")
            item = next((it for it in order["items"] if it["item_id"] == item_id), None)
            if item is None:
                raise ToolError(f"Item {item_id} not found")
            variant = self._variant(item["product_id"], new_item_id)
            if not variant["available"]:
                raise ToolError(f"New item {new_item_id} not found or available")
            diff += variant["price"] - item["price"]
        return diff, variant

    @staticmethod
    def _address(address1: str, address2: str, city: str, state: str, country: str, zip: str) -> dict[str, str]:
        return {
            "address1": address1,
            "address2": address2,
            "city": city,
            "country": country,
            "state": state,
            "zip": zip,
        }

    @staticmethod
    def _add_to_balance(method: dict[str, Any], amount: float) -> None:
        method["balance"] = round(method["balance"] + amount, 2)

    # ---- the tools ----

    @tool(writes=False)
    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return the result rounded to two decimals.

        Args:
            expression: The expression, e.g. '2 + 2'. Allowed: digits, + - * /, parentheses, dots and spaces.
        """
        if not all(ch in "0123456789+-*/(). " for ch in expression):
            raise ToolError("Invalid characters in expression")
        if len(expression) > MAX_EXPRESSION_CHARS:
            raise ToolError(f"Expression too long (over {MAX_EXPRESSION_CHARS} characters)")
        return str(round(float(_arithmetic(ast.parse(expression, filename="<string>", mode="eval"))), 2))

    @tool(writes=True)
    def cancel_pending_order(self, order_id: str, reason: str) -> dict[str, Any]:
        """Cancel an order that is still pending; processed or delivered orders cannot be cancelled.

        Explain the cancellation to the user and get an explicit yes before calling. The order becomes
        'cancelled' and every payment is refunded: at once to a gift card, otherwise within 5-7
        business days. Returns the order after the cancellation.

        Args:
            order_id: The order id, e.g. '#W0000000' (note the leading '#').
            reason: Why the user cancels: 'no longer needed' or 'ordered by mistake'.
        """
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ToolError("Non-pending order cannot be cancelled")
        if reason not in ("no longer needed", "ordered by mistake"):
            raise ToolError("Invalid reason")
        methods = [self._payment_method(order["user_id"], p["payment_method_id"]) for p in order["payment_history"]]

        refunds = []
        for payment, method in zip(order["payment_history"], methods, strict=True):
            refunds.append(
                {
                    "transaction_type": "refund",
                    "amount": payment["amount"],
                    "payment_method_id": payment["payment_method_id"],
                }
            )
            if method["source"] == GIFT_CARD:
                self._add_to_balance(method, payment["amount"])
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["payment_history"].extend(refunds)
        return order

    @tool(writes=True)
    def exchange_delivered_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> dict[str, Any]:
        """Exchange items of a delivered order for other items of the same product.

        A delivered order allows one return or exchange, done by the agent. Explain the exchange to
        the user and get an explicit yes before calling. Returns the order after the request.

        Args:
            order_id: The order id, e.g. '#W0000000' (note the leading '#').
            item_ids: The item ids to exchange, e.g. ['1008292230']; an id may repeat.
            new_item_ids: The item ids to get instead, position by position, each of the same product as the item it replaces; an id may repeat.
            payment_method_id: The payment method that pays or receives the price difference, e.g. 'gift_card_0000000' or 'credit_card_0000000'; found in the user's or the order's details.
        """
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ToolError("Non-delivered order cannot be exchanged")
        self._check_counts(order, item_ids, lambda i: f"Number of {i} not found.")
        if len(item_ids) != len(new_item_ids):
            raise ToolError("The number of items to be exchanged should match.")
        diff, _ = self._price_changes(order, item_ids, new_item_ids, distinct=False)
        diff = round(diff, 2)
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == GIFT_CARD and method["balance"] < diff:
            raise ToolError("Insufficient gift card balance to pay for the price difference")

        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = payment_method_id
        order["exchange_price_difference"] = diff
        return order

    @tool(writes=False)
    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        """Find a user id by first name, last name and zip code.

        Look users up by email first; use this only when the email is not found or not remembered.

        Args:
            first_name: The user's first name, e.g. 'John'.
            last_name: The user's last name, e.g. 'Doe'.
            zip: The zip code of the user's address, e.g. '12345'.
        """
        for user_id, user in self.db["users"].items():
            name = user["name"]
            if (
                name["first_name"].lower() == first_name.lower()
                and name["last_name"].lower() == last_name.lower()
                and user["address"]["zip"] == zip
            ):
                return user_id
        raise ToolError("User not found")

    @tool(writes=False)
    def find_user_id_by_email(self, email: str) -> str:
        """Find a user id by email address.

        Args:
            email: The user's email, e.g. 'something@example.com'.
        """
        for user_id, user in self.db["users"].items():
            if user["email"].lower() == email.lower():
                return user_id
        raise ToolError("User not found")

    @tool(writes=False)
    def get_order_details(self, order_id: str) -> dict[str, Any]:
        """Get the status and details of an order.

        Args:
            order_id: The order id, e.g. '#W0000000' (note the leading '#').
        """
        return self._order(order_id)

    @tool(writes=False)
    def get_product_details(self, product_id: str) -> dict[str, Any]:
        """Get the inventory of a product: all its items (variants) with options, availability and price.

        Args:
            product_id: The product id, e.g. '6086499569'. A product id is not an item id.
        """
        return self._product(product_id)

    @tool(writes=False)
    def get_item_details(self, item_id: str) -> dict[str, Any]:
        """Get the options, availability and price of one item.

        Args:
            item_id: The item id, e.g. '6086499569'. An item id is not a product id.
        """
        for product in self.db["products"].values():
            if item_id in product["variants"]:
                return product["variants"][item_id]
        raise ToolError("Item not found")

    @tool(writes=False)
    def get_user_details(self, user_id: str) -> dict[str, Any]:
        """Get a user's details: name, address, email, payment methods and orders.

        Args:
            user_id: The user id, e.g. 'sara_doe_496'.
        """
        return self._user(user_id)

    @tool(writes=False)
    def list_all_product_types(self) -> str:
        """List the name and product id of every product type (there are 50), as JSON sorted by name.

        Each product type has several items with their own item ids and options.
        """
        return json.dumps({p["name"]: p["product_id"] for p in self.db["products"].values()}, sort_keys=True)

    @tool(writes=True)
    def modify_pending_order_address(
        self, order_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
    ) -> dict[str, Any]:
        """Change the shipping address of a pending order.

        Explain the change to the user and get an explicit yes before calling. Returns the order
        after the change.

        Args:
            order_id: The order id, e.g. '#W0000000' (note the leading '#').
            address1: First address line, e.g. '123 Main St'.
            address2: Second address line, e.g. 'Apt 1', or ''.
            city: City, e.g. 'San Francisco'.
            state: State, e.g. 'CA'.
            country: Country, e.g. 'USA'.
            zip: Zip code, e.g. '12345'.
        """
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise ToolError("Non-pending order cannot be modified")
        order["address"] = self._address(address1, address2, city, state, country, zip)
        return order

    @tool(writes=True)
    def modify_pending_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> dict[str, Any]:
        """Swap items of a pending order for other items of the same product; allowed once per order.

        Explain the change to the user and get an explicit yes before calling. Returns the order
        after the change.

        Args:
            order_id: The order id, e.g. '#W0000000' (note the leading '#').
            item_ids: The item ids to replace, e.g. ['1008292230']; an id may repeat.
            new_item_ids: The item ids to put in their place, position by position, each of the same product as the item it replaces; an id may repeat.
            payment_method_id: The payment method that pays or receives the price difference, e.g. 'gift_card_0000000' or 'credit_card_0000000'; found in the user's or the order's details.
        """
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ToolError("Non-pending order cannot be modified")
        self._check_counts(order, item_ids, lambda i: f"{i} not found")
        if len(item_ids) != len(new_item_ids):
            raise ToolError("The number of items to be exchanged should match")
        diff, variant = self._price_changes(order, item_ids, new_item_ids, distinct=True)
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == GIFT_CARD and method["balance"] < diff:
            raise ToolError("Insufficient gift card balance to pay for the new item")

        kind = "payment" if diff > 0 else "refund"
        order["payment_history"].append(
            {"transaction_type": kind, "amount": float(abs(diff)), "payment_method_id": payment_method_id}
        )
        if method["source"] == GIFT_CARD:
            self._add_to_balance(method, -diff)
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
            item = next(it for it in order["items"] if it["item_id"] == item_id)
            item["item_id"] = new_item_id
            # τ³ gives every swapped item the price and options of the *last* new variant; we keep
            # that so database hashes agree with τ³'s for the same calls.
            item["price"] = variant["price"]
            item["options"] = dict(variant["options"])
        order["status"] = "pending (item modified)"
        return order

    @tool(writes=True)
    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> dict[str, Any]:
        """Pay a pending order with another payment method.

        Explain the change to the user and get an explicit yes before calling. Returns the order
        after the change.

        Args:
            order_id: The order id, e.g. '#W0000000' (note the leading '#').
            payment_method_id: The new payment method, e.g. 'gift_card_0000000' or 'credit_card_0000000'; found in the user's or the order's details.
        """
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise ToolError("Non-pending order cannot be modified")
        method = self._payment_method(order["user_id"], payment_method_id)
        history = order["payment_history"]
        if len(history) != 1 or history[0]["transaction_type"] != "payment":
            raise ToolError("There should be exactly one payment for a pending order")
        old_id = history[0]["payment_method_id"]
        if old_id == payment_method_id:
            raise ToolError("The new payment method should be different from the current one")
        amount = history[0]["amount"]
        if method["source"] == GIFT_CARD and method["balance"] < amount:
            raise ToolError("Insufficient gift card balance to pay for the order")
        old_method = self._payment_method(order["user_id"], old_id)

        history.append({"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id})
        history.append({"transaction_type": "refund", "amount": amount, "payment_method_id": old_id})
        if method["source"] == GIFT_CARD:
            self._add_to_balance(method, -amount)
        if old_method["source"] == GIFT_CARD:
            self._add_to_balance(old_method, amount)
        return order

    @tool(writes=True)
    def modify_user_address(
        self, user_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
    ) -> dict[str, Any]:
        """Change a user's default address.

        Explain the change to the user and get an explicit yes before calling. Returns the user
        after the change.

        Args:
            user_id: The user id, e.g. 'sara_doe_496'.
            address1: First address line, e.g. '123 Main St'.
            address2: Second address line, e.g. 'Apt 1', or ''.
            city: City, e.g. 'San Francisco'.
            state: State, e.g. 'CA'.
            country: Country, e.g. 'USA'.
            zip: Zip code, e.g. '12345'.
        """
        user = self._user(user_id)
        user["address"] = self._address(address1, address2, city, state, country, zip)
        return user

    @tool(writes=True)
    def return_delivered_order_items(
        self, order_id: str, item_ids: list[str], payment_method_id: str
    ) -> dict[str, Any]:
        """Request the return of items of a delivered order; the order becomes 'return requested'.

        Explain the return to the user and get an explicit yes before calling. The user then gets an
        email on how and where to send the items back. Returns the order after the request.

        Args:
            order_id: The order id, e.g. '#W0000000' (note the leading '#').
            item_ids: The item ids to return, e.g. ['1008292230']; an id may repeat.
            payment_method_id: Where the refund goes: the order's original payment method or a gift card, e.g. 'gift_card_0000000'; found in the user's or the order's details.
        """
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ToolError("Non-delivered order cannot be returned")
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] != GIFT_CARD and payment_method_id != order["payment_history"][0]["payment_method_id"]:
            raise ToolError("Payment method should be the original payment method")
        self._check_counts(order, item_ids, lambda _: "Some item not found")

        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = payment_method_id
        return order

    @tool(writes=False)
    def transfer_to_human_agents(self, summary: str) -> str:
        """Hand the user over to a human agent, with a summary of the issue.

        Transfer only when the user explicitly asks for a human, or when the policy and the tools
        do not let you solve the user's issue.

        Args:
            summary: A summary of the user's issue.
        """
        return "Transfer successful"

    # ---- dispatch ----

    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run one call as the model made it; any refusal is an ``Error: ...`` result, never an exception."""
        spec = TOOL_SPECS.get(name)
        if spec is None:
            return ToolResult(f"Error: Tool '{name}' not found.", error=True)
        if not isinstance(arguments, Mapping):
            return ToolResult(f"Error: arguments of {name} must be a JSON object", error=True)
        try:
            spec.check(arguments)
            out = getattr(self, name)(**arguments)
        except Exception as exc:  # ToolError, ArgumentError, or as τ³ does: anything a call raises is seen by the model
            return ToolResult(f"Error: {exc}", error=True)
        return ToolResult(out if isinstance(out, str) else json.dumps(out))


TOOL_SPECS: dict[str, ToolSpec] = {
    name: ToolSpec.from_method(fn) for name, fn in vars(RetailTools).items() if is_tool(fn)
}
WRITE_TOOLS = frozenset(name for name, spec in TOOL_SPECS.items() if spec.writes)


def tool_schemas() -> list[dict[str, Any]]:
    """OpenAI function schemas of all tools, for ``Conversation.tools``."""
    return [spec.openai_schema() for spec in TOOL_SPECS.values()]
