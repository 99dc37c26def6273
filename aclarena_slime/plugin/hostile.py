"""Hostile model turns: what a policy in RL may write, for the conformance kit and the benchmark.

A policy writes anything: megabytes of one repeated tag, numbers thousands of digits long, tool calls
whose JSON decodes to lone surrogates. Each family below once made a plugin of this project stall the
event loop for seconds to minutes, raise out of ``score``, or get its own sample removed; the kit
(:func:`aclarena_slime.plugin.conformance.check_hostile_outputs`) and ``benchmarks/bench_hostile.py`` replay them
on every env. The turns are protocol snippets of all the project's envs mixed together: an env must
cope with another env's syntax as well as with its own.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

# Units that, repeated, once hit a quadratic regex, a slow tokenizer or an unbounded echo.
REPEATED_UNITS = (
    "<search>",
    "<answer>",
    "<think>",
    "</think><search>",
    "<tool_call>",
    "\n",
    "\t",
    " ",
    "*",
    "***\n",
    "[",
    "<<",
    "-\n",
    "A. ",
    "P.S. ",
    "\\boxed{",
    "{",
    "9",
)

_CALL = '<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def _call(name: str, arguments: str = "{}") -> str:
    return _CALL.format(name=name, arguments=arguments)


def _calculate(expression: str) -> str:
    return _call("calculate", json.dumps({"expression": expression}))


def _families(size: int) -> dict[str, Callable[[random.Random], str]]:
    """Generators of hostile turns about ``size`` characters long (the repeated ones) or shaped bad."""
    product = "*".join(["10**24999"] * max(2, size // 10_000))
    return {
        "repeated": lambda r: r.choice(REPEATED_UNITS) * r.randint(1, max(1, size // 8)),
        "digits_in_box": lambda r: "\\boxed{" + "9" * r.choice((4301, 5000, size // 4 or 1)) + "}",
        "deep_box": lambda r: "\\boxed{" + "9^{" * r.randint(3, 60) + "9" + "}" * r.randint(3, 60) + "}",
        "lone_surrogate_call": lambda r: (
            _call(r.choice(("\\ud800", "\\udfff", "x\\ud83d"))) + _call("calculate", '{"expression": "\\udc00"}')
        ),
        "power_product": lambda r: _calculate(product[: r.randint(20, 2000)]),
        "many_calls": lambda r: _call("get_user_details", '{"user_id": "x"}') * r.randint(1, max(1, size // 45)),
        "long_answer": lambda r: "<answer>" + r.choice("xy ,.") * r.randint(1, size) + "</answer>",
        "long_query": lambda r: "<search>" + "word " * r.randint(1, size // 5 or 1) + "</search>",
        "nested_json": lambda r: "<tool_call>" + "[" * r.randint(1, size) + "</tool_call>",
        "unclosed": lambda r: r.choice(("<think>", "<tool_call>{", "<search>", "\\boxed{")) + "x" * r.randint(0, size),
        "refused_writes": lambda r: "".join(_refused_write(r, size) for _ in range(r.randint(1, 4))),
        "junk": lambda r: "".join(
            chr(r.choice((r.randint(0, 0x7F), r.randint(0x80, 0xD7FF), 0xFFFD))) for _ in range(r.randint(0, 2000))
        ),
    }


# Write tools of the customer-service env, with arguments no database holds (or that break the schema).
_WRITES = (
    "cancel_pending_order",
    "modify_pending_order_items",
    "modify_pending_order_address",
    "modify_pending_order_payment",
    "modify_user_address",
    "exchange_delivered_order_items",
    "return_delivered_order_items",
)


def _refused_write(rng: random.Random, size: int) -> str:
    values = ["#W" + "9" * rng.randint(1, 50), "\ud800", "x" * rng.randint(0, size // 10), 10**30, None, [], {"a": 1}]
    arguments = {k: rng.choice(values) for k in rng.sample(_WRITE_KEYS, rng.randint(0, len(_WRITE_KEYS)))}
    return _call(rng.choice(_WRITES), json.dumps(arguments))  # ASCII: a surrogate becomes "\\ud800"


_WRITE_KEYS = ("order_id", "user_id", "reason", "item_ids", "new_item_ids", "payment_method_id", "address1", "zip")


def corpus(size: int = 100_000) -> list[str]:
    """The known-bad turns, one or two per family, deterministic (the issue's minimal inputs among them)."""
    rng = random.Random(0)
    turns = [unit * (size // len(unit)) for unit in REPEATED_UNITS]
    turns += [make(rng) for make in _families(size).values()]
    turns += [
        "\\boxed{" + "9" * 4301 + "}",
        _call("\\ud800"),
        _calculate("*".join(["10**24999"] * 100)),
        "<answer>" + "x" * size + "</answer>",
    ]
    return turns


def random_turns(n: int, size: int = 100_000, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` hostile turns drawn from every family in turn: ``(family, text)``."""
    rng = random.Random(seed)
    families = sorted(_families(size).items())
    return [(name, make(rng)) for name, make in (families[i % len(families)] for i in range(n))]


def hypothesis_turns(size: int = 20_000):  # -> hypothesis.strategies.SearchStrategy[str]
    """A hypothesis strategy of hostile turns: fragments of every env's syntax, shuffled and repeated."""
    from hypothesis import strategies as st  # a dev dependency: only the kit's property check needs it

    fragments = st.sampled_from(
        [
            *REPEATED_UNITS,
            "</search>",
            "</answer>",
            "</tool_call>",
            '{"name": "calculate", "arguments": {',
            "\\ud800",
            "}",
        ]
    )
    repeated = st.tuples(fragments, st.integers(1, size // 8)).map(lambda t: t[0] * t[1])
    return st.lists(st.one_of(fragments, repeated, st.text(max_size=20)), max_size=12).map("".join)
