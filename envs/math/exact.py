"""An exact comparison of plain answers that decides most checks without sympy.

Most final answers are integers, fractions, decimals, square roots, multiples of π, or tuples and
intervals of them. Those are parsed here into exact values — sums of rational multiples of
``√r · π^k`` with ``r`` a square-free integer; square roots of distinct square-free integers are
linearly independent over the rationals and π is transcendental, so two such sums are equal only when
their canonical forms are, and an equality found here is a proof — and compared in microseconds. Anything outside that small grammar, and any case where
``math-verify`` compares in ways of its own that are not emulated here (a decimal with more than six
places, brackets of different kinds around things it does not read as intervals), is left undecided and goes to ``math-verify`` in the worker pool.

Every function here runs on the event loop: the work is linear in the length of the answer and
bounded by the caps below (no ``int()`` of an unbounded digit string, no unbounded factoring).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

MAX_CHARS = 200  # longer answers are not parsed here
MAX_DIGITS = 60  # a number literal with more digits is not parsed here (plain integers excepted)
MAX_RADICAND = 10**6  # square roots of larger numbers are not simplified here
MAX_SIG_DIGITS = 15  # math-verify holds decimals as 15-digit floats: keep clear of its precision

_PLAIN_INTEGER = re.compile(r"[+-]?\d+")
_TOKEN = re.compile(r"(\d+(?:\.\d+)?)|(\\[a-zA-Z]+)|([{}()\[\],+\-/])|(\S)")
_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3}(?:\{,\}\d{3})+)(?![\d.])")
_COMMANDS = {c: c for c in ("\\frac", "\\sqrt", "\\pi", "\\infty")} | {"\\dfrac": "\\frac", "\\tfrac": "\\frac"}
_JUXTAPOSED = ("\\sqrt", "\\pi")
_IGNORED = {"\\left", "\\right"}

# An exact value: {(square-free radicand, power of π): rational coefficient}, zero terms dropped;
# (1, 0) is the rational part. ±∞ (only as a whole answer or a tuple element) is {(0, 0): ±1}.
Value = dict[tuple[int, int], Fraction]
ONE = (1, 0)
INFINITY = (0, 0)


class _Undecided(Exception):
    """The answer is outside the grammar decided here."""


def _plain_integer(text: str) -> str | None:
    """A plain integer's canonical digits (sign, no leading zeros), for integers of any length."""
    if not _PLAIN_INTEGER.fullmatch(text):
        return None
    negative = text.startswith("-")
    digits = text.lstrip("+-").lstrip("0") or "0"
    return "-" + digits if negative and digits != "0" else digits


@lru_cache(maxsize=4096)
def _square_free(n: int) -> tuple[int, int]:
    """``(k, r)`` with ``n == k * k * r`` and ``r`` square-free (``n <= MAX_RADICAND``)."""
    outside, d = 1, 2
    while d * d <= n:
        while n % (d * d) == 0:
            n //= d * d
            outside *= d
        d += 1
    return outside, n


def _mul(a: Value, b: Value) -> Value:
    out: Value = {}
    for (r, k), x in a.items():
        for (s, m), y in b.items():
            g = math.gcd(r, s)
            key = ((r // g) * (s // g), k + m)
            out[key] = out.get(key, Fraction(0)) + x * y * g
    return {key: c for key, c in out.items() if c}


def _add(a: Value, b: Value, sign: int = 1) -> Value:
    out = dict(a)
    for key, c in b.items():
        out[key] = out.get(key, Fraction(0)) + sign * c
    return {key: c for key, c in out.items() if c}


def _inverse(a: Value) -> Value:
    """1/a for a single term ``c·√r·π^k`` (= √r·π^-k / (c·r)); sums are left to math-verify."""
    if len(a) != 1:
        raise _Undecided
    (((r, k), c),) = a.items()
    return {(r, -k): 1 / (c * r)}


def _sqrt(a: Value) -> Value:
    """√q for a rational q ≥ 0: √(p/q) = √(p·q) / q, with the square part of p·q taken out."""
    if not a:
        return {}
    if set(a) != {ONE} or a[ONE] < 0:
        raise _Undecided
    q = a[ONE]
    n = q.numerator * q.denominator
    if n > MAX_RADICAND:
        raise _Undecided
    outside, radicand = _square_free(n)
    return {(radicand, 0): Fraction(outside, q.denominator)}


class _Parser:
    """Recursive descent over the tokens of one answer; every rule consumes at least one token."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens, self.at = tokens, 0
        self.places = 0  # the most decimal places of any literal: math-verify rounds decimals to 6

    def peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.at >= len(self.tokens) or (expected is not None and self.tokens[self.at][1] != expected):
            raise _Undecided
        self.at += 1
        return self.tokens[self.at - 1]

    def expression(self) -> Value:
        sign = -1 if self.peek() == "-" else 1
        if self.peek() in ("+", "-"):
            self.take()
        if self.peek() == "\\infty":  # ±∞ stands alone: an interval's end, never a term of a sum
            self.take()
            if self.peek() not in (None, ",", ")", "]"):
                raise _Undecided
            return {INFINITY: Fraction(sign)}
        value = self.term()
        if sign < 0:
            value = {r: -c for r, c in value.items()}
        while self.peek() in ("+", "-"):
            op = self.take()[1]
            value = _add(value, self.term(), 1 if op == "+" else -1)
        return value

    def term(self) -> Value:
        value = self.atom()
        while self.peek() in _JUXTAPOSED:  # 2\sqrt{3}, \frac{1}{2}\sqrt{3}, 3\pi: roots and π multiply
            value = _mul(value, self.atom())
        if self.peek() == "/":  # a/b; a/b/c reads differently to different parsers: not decided here
            self.take()
            value = _mul(value, _inverse(self.atom()))
            if self.peek() == "/" or self.peek() in _JUXTAPOSED:
                raise _Undecided
        return value

    def argument(self) -> Value:
        """A braced argument, or a single digit as in ``\\frac12`` and ``\\sqrt2``."""
        if self.peek() == "{":
            self.take()
            value = self.expression()
            self.take("}")
            return value
        kind, text = self.take()
        if kind != "digit":
            raise _Undecided
        return {ONE: Fraction(int(text))} if text != "0" else {}

    def atom(self) -> Value:
        kind, text = self.take()
        if kind == "number":
            return self.number(text)
        if text == "\\frac":
            numerator = self.argument()
            return _mul(numerator, _inverse(self.argument()))
        if text == "\\sqrt":
            return _sqrt(self.argument())
        if text == "\\pi":
            return {(1, 1): Fraction(1)}
        if text in ("{", "("):
            value = self.expression()
            self.take("}" if text == "{" else ")")
            return value
        raise _Undecided

    def number(self, text: str) -> Value:
        digits = text.replace(".", "").lstrip("0")
        if len(text) > MAX_DIGITS:
            raise _Undecided
        if "." in text:
            if len(digits) > MAX_SIG_DIGITS:
                raise _Undecided
            self.places = max(self.places, len(text) - text.index(".") - 1)
        whole, _, decimals = text.partition(".")
        value = Fraction(int(whole + decimals), 10 ** len(decimals)) if decimals else Fraction(int(whole))
        return {ONE: value} if value else {}


def _tokens(text: str) -> list[tuple[str, str]]:
    text = _THOUSANDS.sub(lambda m: m.group(1).replace("{,}", ""), text)
    tokens: list[tuple[str, str]] = []
    for number, command, symbol, other in _TOKEN.findall(text):
        if other:
            raise _Undecided
        if command:
            if command in _IGNORED:
                continue
            if command not in _COMMANDS:
                raise _Undecided
            tokens.append(("command", _COMMANDS[command]))
        elif number:
            previous = tokens[-1][1] if tokens else None
            # \frac12 is \frac{1}{2} and \sqrt2 is \sqrt{2}: their arguments are single digits
            split = 2 if previous == "\\frac" else 1 if previous == "\\sqrt" else 0
            if split and "." not in number and len(number) <= split:
                tokens.extend(("digit", d) for d in number)
            elif split:
                raise _Undecided
            else:
                tokens.append(("number", number))
        else:
            tokens.append(("symbol", symbol))
    return tokens


@lru_cache(maxsize=8192)
def parse(text: str) -> tuple[str, tuple[Value, ...], int, bool] | None:
    """``(brackets, values, places, bare)`` for an answer in the grammar, else None.

    ``brackets`` is ``""`` for a single value, else the opening and closing bracket of a tuple or
    interval (``"()"``, ``"[)"``, ...); ``places`` is the most decimal places of a literal in it (0: no
    decimal), ``bare`` says whether the whole answer is one decimal literal (math-verify's Float).
    """
    text = text.strip().strip("$").strip()
    if not text or len(text) > MAX_CHARS:
        return None
    try:
        tokens = _tokens(text)
        if not tokens:
            return None
        parser = _Parser(tokens)
        brackets = ""
        if tokens[0][1] in "([" and tokens[-1][1] in ")]" and any(t[1] == "," for t in tokens):
            parser.take()
            values = [parser.expression()]
            while parser.peek() == ",":
                parser.take()
                values.append(parser.expression())
            brackets = tokens[0][1] + parser.take()[1]
            if brackets[1] not in ")]":
                raise _Undecided
        else:
            values = [parser.expression()]
        if parser.at != len(tokens):
            raise _Undecided
    except (_Undecided, ZeroDivisionError):
        return None
    if len(values) == 2:  # an interval is open at an infinite end, whatever bracket it is written with
        brackets = ("(" if INFINITY in values[0] else brackets[0]) + (")" if INFINITY in values[1] else brackets[1])
    bare = len(tokens) - (tokens[0][1] in "+-") == 1 and parser.places > 0
    return brackets, tuple(values), parser.places, bare


def _as_float(value: Value) -> float:
    if INFINITY in value:
        return math.inf * value[INFINITY]
    return sum(float(c) * math.sqrt(r) * math.pi**k for (r, k), c in value.items())


def _rounded(value: Value) -> int | None:
    """``value`` rounded to 6 decimal places, times 10**6; None at a tie or beyond float precision."""
    if set(value) <= {ONE}:
        scaled = value.get(ONE, Fraction(0)) * 10**6
        if (scaled - math.floor(scaled)) == Fraction(1, 2):
            return None
        return math.floor(scaled + Fraction(1, 2))
    if INFINITY in value:
        return None
    scaled = _as_float(value) * 10**6
    if abs(scaled) > 1e13 or abs(scaled - math.floor(scaled) - 0.5) < 1e-3:
        return None
    return math.floor(scaled + 0.5)


def _scalars_equal(a: Value, b: Value, places: int, bare: bool) -> bool | None:
    """Exact values are equal or not; with a decimal, math-verify compares both rounded to 6 places,
    which is emulated where its outcome is certain: a bare decimal of at most 6 places against a
    decimal-free value (``bare``), or roundings that differ."""
    if a == b:
        return True
    if not places:
        return False
    x, y = _rounded(a), _rounded(b)
    if x is None or y is None:
        return None
    if x != y:
        return False
    return True if bare and places <= 6 else None


def _increasing(values: tuple[Value, ...]) -> bool:
    return len(values) == 2 and _as_float(values[0]) < _as_float(values[1])


def decide(gold: str, pred: str) -> tuple[bool, str] | None:
    """``(correct, "integer" | "exact")`` where the answer is decided here; None where math-verify must."""
    gold_int, pred_int = _plain_integer(gold.strip()), _plain_integer(pred.strip())
    if gold_int is not None and pred_int is not None:
        return gold_int == pred_int, "integer"
    verdict = compare(gold, pred)
    return None if verdict is None else (verdict, "exact")


def compare(gold: str, pred: str) -> bool | None:
    """True or False where the answer is decided exactly here; None where math-verify must decide."""
    gold_int, pred_int = _plain_integer(gold.strip()), _plain_integer(pred.strip())
    if gold_int is not None and pred_int is not None:
        return gold_int == pred_int
    parsed_gold, parsed_pred = parse(gold), parse(pred)
    if parsed_gold is None or parsed_pred is None:
        return None
    gold_brackets, gold_values, gold_places, gold_bare = parsed_gold
    pred_brackets, pred_values, pred_places, pred_bare = parsed_pred
    places = max(gold_places, pred_places)
    # one side a bare decimal, the other free of decimals: the one comparison emulated to its rounding
    bare = (gold_bare and not pred_places) or (pred_bare and not gold_places)
    if not gold_brackets and not pred_brackets:
        return _scalars_equal(gold_values[0], pred_values[0], places, bare)
    if not gold_brackets or not pred_brackets or len(gold_values) != len(pred_values):
        return None  # a value against a tuple, or tuples of different lengths: math-verify's rules
    if len(gold_values) > 2 and (
        gold_brackets != "()" or pred_brackets != "()" or any(INFINITY in v for v in gold_values + pred_values)
    ):
        return None  # only plain tuples beyond pairs: [a,b,c) and ∞ inside a tuple are read oddly
    verdicts = [_scalars_equal(g, p, places, False) for g, p in zip(gold_values, pred_values, strict=True)]
    if gold_brackets == pred_brackets and all(verdicts):
        return True
    if None in verdicts:
        return None
    # math-verify reads an increasing (a,b) or [a,b] as an interval, a decreasing [a,b] as the empty
    # set (so two of those are equal) and a decreasing (a,b) as a tuple: pairs differ when both are
    # real intervals or both are written (a,b) (compared in order either way). A decreasing pair with an
    # infinite end had its bracket rewritten above ("(1,-\infty]" reads "()" here), so math-verify decides it
    if len(gold_values) == 2:
        both_intervals = _increasing(gold_values) and _increasing(pred_values)
        infinite = any(INFINITY in v for v in gold_values + pred_values)
        return False if both_intervals or (gold_brackets == pred_brackets == "()" and not infinite) else None
    return False
