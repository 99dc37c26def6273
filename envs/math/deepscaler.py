"""The authors' math grader (``grader: deepscaler``): a string match, then a guarded sympy check.

The ACLArena authors score math with slime's ``--rm-type deepscaler``, DeepScaleR's grader
(WillDreamer/ACLArena ``slime/slime/rollout/rm_hub/deepscaler.py`` lines 36-40: correct when the
"mathd" rule or the "sympy" rule accepts). This module is our own implementation of that documented
behaviour, not their code:

- **mathd**: both answers are canonicalised as strings (Hendrycks' MATH normalisation: ``\\dfrac`` is
  ``\\frac``, ``\\left``/``\\right``, degrees, ``\\$``, ``\\%``, trailing ``\\text{ units}`` and spaces
  dropped, ``\\frac12`` braced, ``a/b`` of integers written ``\\frac{a}{b}``, ``0.5`` is ``\\frac{1}{2}``,
  a short ``x =`` prefix dropped) and must then be equal;
- **sympy**: both answers are normalised more loosely (``%``, ``$``, units, outer braces and case
  dropped, LaTeX read as plain text) and compared element by element, with three gates that make it
  stricter than algebra: a fraction ``p/q`` only equals the same fraction as written (``2/4`` is not
  ``1/2``), an integer only equals something that reads as an integer (``2+3`` is not ``5``), and
  tuples must have the same brackets and length. Only what passes the gates is handed to
  ``sympy.simplify`` (in the verifier's worker process, under its hard timeout).

So it disagrees with ``math-verify`` on purpose: ``\\frac{2}{4}`` against ``\\frac{1}{2}`` and ``2+3``
against ``5`` score 0 here, ``50\\%`` against ``50`` scores 1. LaTeX is read as text by our own small
reader (``\\frac``, ``\\sqrt``, ``\\pi``, ``\\cdot``, ``\\times``, ``\\infty``; other commands lose their
backslash) where DeepScaleR uses ``pylatexenc``; answers it reads differently are rare and exotic.
"""

from __future__ import annotations

import re

_TEXT_WRAPPED = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_UNITS = (
    "degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour",
    "day", "week", "month", "year", "foot", "feet", "inch", "yard",
)  # fmt: skip
_UNIT_PATTERNS = [re.compile(rf"{unit}(es)?(s)? *(\^[0-9]+)?") for unit in _UNITS]
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_THOUSANDS = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_MIXED_NUMBER = re.compile(r"([0-9]) +([0-9])")
_BAD_SUBSTRINGS = ("^{", "^(")  # powers sympy may take forever on: not evaluated
_BAD_POWERS = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_BRACKETS = "()[]"
MAX_CHARS = 1000  # a longer answer is not normalised (it is wrong in any grader that reads it)


# ---------------------------------------------------------------------------------------------------
# mathd: Hendrycks' string canonicalisation
# ---------------------------------------------------------------------------------------------------


def _brace_fracs(text: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{7}`` -> ``\\frac{1}{7}``; unchanged when malformed."""
    head, *rest = text.split("\\frac")
    out = head
    for part in rest:
        out += "\\frac"
        if part.startswith("{"):
            out += part
            continue
        if len(part) < 2:
            return text
        a, b, tail = part[0], part[1], part[2:]
        out += f"{{{a}}}{{{b}}}{tail}" if b != "{" else f"{{{a}}}{b}{tail}"
    return out


def _slash_to_frac(text: str) -> str:
    """``3/4`` (two plain integers) -> ``\\frac{3}{4}``."""
    parts = text.split("/")
    if len(parts) == 2 and all(re.fullmatch(r"-?\d+", p) for p in parts) and text == f"{int(parts[0])}/{int(parts[1])}":
        return f"\\frac{{{int(parts[0])}}}{{{int(parts[1])}}}"
    return text


def _brace_sqrt(text: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``."""
    head, *rest = text.split("\\sqrt")
    return head + "".join("\\sqrt" + (p if p.startswith("{") or not p else "{" + p[0] + "}" + p[1:]) for p in rest)


def mathd_normalize(answer: str) -> str:
    """The MATH dataset's canonical string form of an answer (see the module docstring)."""
    text = answer.strip()
    wrapped = _TEXT_WRAPPED.search(text)
    if wrapped:
        text = wrapped.group("text").strip()
    text = text.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    text = text.replace("\\left", "").replace("\\right", "")
    text = text.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in text:
        units = text.split("\\text{ ")
        if len(units) == 2:  # "5 \text{ cm}": the value on the left
            text = units[0]
    text = text.replace("\\%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text.startswith("."):
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 5", "k=3"
        text = sides[1]
    text = _brace_sqrt(text).replace(" ", "")
    text = _brace_fracs(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_to_frac(text)


def mathd_equal(pred: str, gold: str) -> bool:
    """The "mathd" rule: equal canonical strings."""
    return mathd_normalize(pred) == mathd_normalize(gold)


# ---------------------------------------------------------------------------------------------------
# sympy: loose normalisation, the gates, then algebra
# ---------------------------------------------------------------------------------------------------


def _group(text: str, start: int) -> tuple[str, int]:
    """The braced group at ``start`` (or the single character there) and the index after it."""
    if start >= len(text):
        return "", start
    if text[start] != "{":
        return text[start], start + 1
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i], i + 1
    return text[start + 1 :], len(text)


def _simple(text: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9.]+", text))


def latex_to_text(latex: str) -> str:
    """Plain text of a LaTeX answer: ``\\frac{a}{b}`` is ``a/b`` (parenthesised unless simple),
    ``\\sqrt{x}`` is ``sqrt(x)``, ``\\pi`` is ``pi``; other commands lose their backslash."""
    out: list[str] = []
    i = 0
    while i < len(latex):
        if latex.startswith("\\frac", i):
            num, i = _group(latex, _skip_spaces(latex, i + 5))
            den, i = _group(latex, _skip_spaces(latex, i))
            num, den = latex_to_text(num), latex_to_text(den)
            out.append(" " + (num if _simple(num) else f"({num})") + "/" + (den if _simple(den) else f"({den})"))
        elif latex.startswith("\\sqrt", i):
            body, i = _group(latex, _skip_spaces(latex, i + 5))
            out.append(f"sqrt({latex_to_text(body)})")
        elif latex[i] == "\\":
            name = re.match(r"\\([A-Za-z]+|.)", latex[i:])
            word = name.group(1) if name else ""
            i += 1 + len(word)
            out.append({"pi": "pi", "cdot": "*", "times": "*", "infty": "inf", "cup": "U"}.get(word, word))
        else:
            out.append(latex[i])
            i += 1
    return "".join(out).strip()


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i] == " ":
        i += 1
    return i


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _strip_thousands(text: str) -> str:
    while True:
        stripped = _THOUSANDS.sub(r"\1\3\4", text)
        if stripped == text:
            return text
        text = stripped


def _reads_as_int(text: str) -> bool:
    try:
        value = float(_strip_thousands(text))
    except (ValueError, OverflowError):
        return False
    return value == value and abs(value) != float("inf") and abs(value - round(value)) <= 1e-7


def sympy_normalize(answer: str) -> str:
    """The loose normal form the sympy rule compares (see the module docstring)."""
    text = answer
    wrapped = _TEXT_WRAPPED.search(text)
    if wrapped:
        text = wrapped.group("text")
    text = text.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    text = text.replace(" or ", " , ").replace(" and ", " , ")
    text = text.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in _UNIT_PATTERNS:
        text = unit.sub("", text)
    text = re.sub(r"\^ *\\circ", "", text)
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    text = re.sub(r",\\! *", "", text)
    if _is_float(text) and _reads_as_int(text):
        text = str(round(float(text)))
    if "\\" in text:
        text = latex_to_text(text.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac"))
    text = re.sub(r"- *", "-", text)
    text = _MIXED_NUMBER.sub(r"\1+\2", text)  # "7 3/4" is 7+3/4
    text = text.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _reads_as_int(text):
        text = str(int(float(_strip_thousands(text).replace(",", ""))))
    return text


def split_elements(text: str) -> list[str]:
    """The elements of a tuple or interval ``(a,b)``/``[a,b)``; a lone value otherwise."""
    text = _strip_thousands(text)
    if not text:
        return []
    inner = text[1:-1]
    if len(text) > 2 and text[0] in _BRACKETS and text[-1] in _BRACKETS and not any(c in inner for c in _BRACKETS):
        return [element.strip() for element in inner.split(",")]
    return [text]


def may_evaluate(expression: str) -> bool:
    """Whether sympy is let near an expression: at most two unknown letters, no towers of powers."""
    letters = {c for c in expression.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2 or any(bad in expression for bad in _BAD_SUBSTRINGS):
        return False
    return not any(pattern.search(expression) for pattern in _BAD_POWERS)


def sympy_pairs(pred: str, gold: str) -> bool | list[tuple[str, str]]:
    """The sympy rule up to the algebra: a verdict, or the (gold, pred) element pairs sympy must equate."""
    gold_n, pred_n = sympy_normalize(gold), sympy_normalize(pred)
    if gold_n == pred_n:
        return True
    if not pred_n:
        return False
    gold_elements, pred_elements = split_elements(gold_n), split_elements(pred_n)
    if len(gold_elements) > 1 and (gold_n[0] != pred_n[0] or gold_n[-1] != pred_n[-1]):
        return False  # a tuple against a differently bracketed answer
    if len(gold_elements) != len(pred_elements):
        return False
    pairs = []
    for g, p in zip(gold_elements, pred_elements, strict=True):
        if _FRACTION.search(g) and _FRACTION.search(p):
            if g != p:  # an unreduced fraction is not the reduced one
                return False
        elif _reads_as_int(g) != _reads_as_int(p):
            return False  # an integer answer must be written as one
        else:
            pairs.append((g, p))
    return pairs or True


def sympy_equal(gold: str, pred: str) -> bool:
    """``gold - pred`` simplifies to 0 (blocking and possibly slow: run it in a worker process)."""
    import sympy
    from sympy.parsing import sympy_parser

    expression = f"({gold})-({pred})"
    if not may_evaluate(expression):
        return False
    names = {k: v for k, v in vars(sympy).items() if not k.startswith("_")}
    transformations = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
    try:
        difference = sympy_parser.parse_expr(
            expression.replace("^", "**"),
            local_dict={},
            global_dict={"__builtins__": {}, **names},
            transformations=transformations,
        )
        return sympy.simplify(difference) == 0
    except Exception:  # noqa: BLE001 - an expression sympy cannot read is not equal
        return False


def grade_blocking(pred: str, gold: str) -> bool:
    """The whole rule in one call: mathd, then sympy (for the verifier's worker process)."""
    if mathd_equal(pred, gold):
        return True
    verdict = sympy_pairs(pred, gold)
    if isinstance(verdict, bool):
        return verdict
    return all(sympy_equal(g, p) for g, p in verdict)


def decide(pred: str, gold: str) -> bool | None:
    """The rule where it needs no sympy (on the event loop, linear work); None: sympy must decide."""
    if len(pred) > MAX_CHARS or len(gold) > MAX_CHARS:
        return False
    if mathd_equal(pred, gold):
        return True
    verdict = sympy_pairs(pred, gold)
    return verdict if isinstance(verdict, bool) else None
