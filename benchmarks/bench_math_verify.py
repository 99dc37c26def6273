"""Math grading: rate, agreement with math-verify, and event-loop stalls — ours beside math-verify and slime's.

    .venv/bin/python benchmarks/bench_math_verify.py [--workers 2] [--batch 300]
    .venv/bin/python benchmarks/bench_math_verify.py --write-answer-set   # regenerate the fixed set

The fixed answer set (``bench_math_verify.jsonl`` beside this file, made by :func:`answer_set`): AIME
integers with leading zeros, fractions, decimals, roots, multiples of π, tuples and intervals, a
third of them wrong. Each grader grades every answer one after another (answers/s), and is compared
with math-verify's verdict on the same answer (agreement). "worst stall" is how late a 10 ms
heartbeat wakes while a batch of answers is graded: for the math env, the whole set gathered on one
event loop (median and worst of ``--repeats`` batches, caches emptied before each); for a synchronous grader, its slowest single answer (what it holds the loop for when a
reward function calls it inline). slime's ``grade_answer_verl`` is measured when slime is
importable (run this with a venv that has slime). Caches start empty for each measured run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aclarena_envs.math import exact
from aclarena_envs.math.env import MathEnvironment
from aclarena_envs.math.verifier import VerifierPool, verify_answer
from aclarena_slime.plugin.contract import Task

ANSWER_SET = Path(__file__).with_suffix(".jsonl")


def _frac(q: Fraction) -> str:
    sign = "-" if q < 0 else ""
    q = abs(q)
    return f"{sign}{q.numerator}" if q.denominator == 1 else f"{sign}\\frac{{{q.numerator}}}{{{q.denominator}}}"


def _pair(rng: random.Random, kind: str, right: bool) -> tuple[str, str]:
    """One gold answer and one prediction of ``kind``, equal (in some other spelling) when ``right``."""
    if kind == "aime":
        n = rng.randint(0, 999)
        pred = n if right else rng.choice([n + rng.randint(1, 9), abs(n - rng.randint(1, 9)) + (n < 10), 999 - n])
        return str(n), rng.choice([str(pred), f"{pred:03d}", f"{pred:03d}", f"0{pred:03d}"])
    if kind == "fraction":
        q = Fraction(rng.randint(1, 60), rng.randint(2, 60)) * rng.choice([1, 1, -1])
        q = q if q.denominator > 1 else q + Fraction(1, 7)
        p = q if right else rng.choice([q + Fraction(1, q.denominator), 1 / q, -q])
        k = rng.randint(2, 5)
        sign = "-" if p < 0 else ""
        spellings = [
            _frac(p),
            f"{sign}\\dfrac{{{abs(p.numerator)}}}{{{p.denominator}}}",
            f"{sign}\\frac{{{k * abs(p.numerator)}}}{{{k * p.denominator}}}",
            f"{p.numerator}/{p.denominator}",
        ]
        return _frac(q), rng.choice(spellings)
    if kind == "decimal":
        q = Fraction(rng.randint(1, 400), rng.choice([2, 4, 5, 8, 10, 20, 25, 3, 6, 7]))
        p = q if right else q + Fraction(rng.randint(1, 9), 10)
        if p.denominator in (3, 6, 7):  # a repeating decimal, to six places: math-verify's rounding decides
            return _frac(q), f"{float(p):.6f}"
        return _frac(q), rng.choice([f"{float(p):g}", f"{float(p):.3f}", _frac(p)])
    if kind == "root":
        a, b, c = rng.randint(1, 9), rng.choice([2, 3, 5, 6, 7, 10, 11]), rng.randint(2, 9)
        a2 = a if right else a + 1
        form = rng.randrange(3)
        if form == 0:
            return f"{a}\\sqrt{{{b}}}", rng.choice([f"\\sqrt{{{a2 * a2 * b}}}", f"{a2}\\sqrt{{{b}}}"])
        if form == 1:
            gold = f"\\frac{{{a}\\sqrt{{{b}}}}}{{{c}}}"
            return gold, rng.choice(
                [f"\\frac{{{a2}}}{{{c}}}\\sqrt{{{b}}}", f"\\frac{{\\sqrt{{{a2 * a2 * b}}}}}{{{c}}}"]
            )
        return f"{a}+\\sqrt{{{b}}}", rng.choice([f"\\sqrt{{{b}}}+{a2}", f"{a2}+\\sqrt{{{b}}}"])
    if kind == "pi":
        k, m = rng.randint(1, 12), rng.randint(2, 12)
        k2 = k if right else k + 1
        return f"\\frac{{{k}\\pi}}{{{m}}}", rng.choice([f"\\frac{{{k2}}}{{{m}}}\\pi", f"\\frac{{{k2}\\pi}}{{{m}}}"])
    if kind == "tuple":
        items = [_frac(Fraction(rng.randint(-9, 20), rng.choice([1, 1, 1, 2, 3]))) for _ in range(rng.choice([2, 3]))]
        pred = list(items)
        if not right:
            if rng.random() < 0.5 and pred[0] != pred[1]:
                pred[0], pred[1] = pred[1], pred[0]
            else:
                pred[-1] = _frac(Fraction(rng.randint(21, 40)))
        gold = "(" + ", ".join(items) + ")"
        return gold, rng.choice(["(" + ",".join(pred) + ")", "\\left(" + ", ".join(pred) + "\\right)"])
    # interval
    lo = rng.randint(-20, 10)
    hi = lo + rng.randint(1, 15)
    ends = [(str(lo), str(hi)), ("-\\infty", str(hi)), (str(lo), "\\infty")][rng.randrange(3)]
    left = "(" if ends[0].endswith("infty") else rng.choice("([")
    right_bracket = ")" if ends[1].endswith("infty") else rng.choice(")]")
    gold = f"{left}{ends[0]}, {ends[1]}{right_bracket}"
    if right:
        return gold, f"\\left{left}{ends[0]},{ends[1]}\\right{right_bracket}".replace("\\left[", "[").replace(
            "\\right]", "]"
        )
    if rng.random() < 0.5 and not ends[1].endswith("infty"):
        return gold, f"{left}{ends[0]},{ends[1]}{')' if right_bracket == ']' else ']'}"
    return gold, f"{left}{ends[0]},{hi + 1 if not ends[1].endswith('infty') else ends[1]}{right_bracket}".replace(
        f"{left}-\\infty,\\infty", f"{left}{lo - 5},\\infty"
    )


KINDS = {"aime": 0.40, "fraction": 0.14, "decimal": 0.08, "root": 0.14, "pi": 0.04, "tuple": 0.10, "interval": 0.10}


def answer_set(n: int = 300, seed: int = 0) -> list[dict[str, str]]:
    """The fixed answer set: ``{"kind", "gold", "pred"}`` records, a third of them wrong."""
    rng = random.Random(seed)
    kinds = rng.choices(list(KINDS), weights=list(KINDS.values()), k=n)
    records = []
    for i, kind in enumerate(kinds):
        gold, pred = _pair(rng, kind, right=i % 3 != 0)
        records.append({"kind": kind, "gold": gold, "pred": pred})
    return records


def load_answer_set(path: Path = ANSWER_SET) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def math_verify_verdicts(pairs: list[tuple[str, str]]) -> tuple[list[bool], list[float]]:
    """math-verify's verdicts (gold parsed as ``$gold$``, the prediction as ``\\boxed{pred}``, as the
    env's workers do) and the seconds each took."""
    from math_verify import parse, verify

    verdicts, times = [], []
    for gold, pred in pairs:
        start = time.perf_counter()
        verdicts.append(bool(verify(parse(f"${gold}$"), parse(f"\\boxed{{{pred}}}"))))
        times.append(time.perf_counter() - start)
    return verdicts, times


def slime_grader() -> Callable[[str, str], bool] | None:
    try:
        from slime.rollout.rm_hub.math_utils import grade_answer_verl
    except ImportError:
        return None
    return lambda gold, pred: bool(grade_answer_verl(f"\\boxed{{{pred}}}", gold))


def _clear_caches() -> None:
    exact.parse.cache_clear()
    exact._square_free.cache_clear()


async def _sequential(pairs: list[tuple[str, str]], pool: VerifierPool) -> tuple[list[bool], float, int]:
    _clear_caches()
    start = time.perf_counter()
    verdicts = [await verify_answer(g, p, pool) for g, p in pairs]
    elapsed = time.perf_counter() - start
    return [v.correct for v in verdicts], elapsed, sum(v.method in ("integer", "exact") for v in verdicts)


async def _gathered_stall(coroutines: list) -> tuple[float, float]:
    """Seconds to finish the gathered ``coroutines`` and the heartbeat's worst lateness meanwhile."""
    stall, stop = 0.0, False

    async def heartbeat() -> None:
        nonlocal stall
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            stall = max(stall, time.perf_counter() - t - 0.01)

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.02)  # the heartbeat is ticking before the batch lands
    start = time.perf_counter()
    await asyncio.gather(*coroutines)
    elapsed = time.perf_counter() - start
    stop = True
    await beat
    return elapsed, stall


async def _env_scores(env: MathEnvironment, pairs: list[tuple[str, str]]) -> list:
    episodes = []
    for gold, pred in pairs:
        episode = await env.start(Task("Q", gold, {"env": "math"}))
        await episode.step(f"<think>reasoning</think> The answer is \\boxed{{{pred}}}.")
        episodes.append(episode)
    return episodes


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="gathered batches to time (the machine is noisy)")
    parser.add_argument("--write-answer-set", action="store_true", help=f"regenerate {ANSWER_SET.name} and exit")
    args = parser.parse_args()
    if args.write_answer_set:
        ANSWER_SET.write_text("".join(json.dumps(r) + "\n" for r in answer_set()))
        print(f"wrote {ANSWER_SET}")
        return
    records = load_answer_set()
    pairs = [(r["gold"], r["pred"]) for r in records]
    n = len(pairs)

    reference, mv_times = math_verify_verdicts(pairs)
    rows = [("math-verify (inline)", n / sum(mv_times), n, None, f"{max(mv_times) * 1000:.0f} (blocks)")]

    grade = slime_grader()
    if grade is not None:
        times, verdicts = [], []
        for gold, pred in pairs:
            start = time.perf_counter()
            verdicts.append(grade(gold, pred))
            times.append(time.perf_counter() - start)
        agree = sum(a == b for a, b in zip(verdicts, reference, strict=True))
        rows.append(
            ("slime grade_answer_verl (inline)", n / sum(times), agree, None, f"{max(times) * 1000:.0f} (blocks)")
        )

    pool = VerifierPool(workers=args.workers, timeout_s=5.0)
    await asyncio.gather(*(pool.check("x", f"x+{i}") for i in range(args.workers)))  # start-up is not the rate
    verdicts, elapsed, decided = await _sequential(pairs, pool)
    pool.close()
    agree = sum(a == b for a, b in zip(verdicts, reference, strict=True))

    env = MathEnvironment({"workers": args.workers})
    warm = await env.start(Task("Q", "x", {"env": "math"}))
    await warm.step("\\boxed{x+1}")
    await warm.score()  # the workers have started
    _clear_caches()
    episodes = await _env_scores(env, pairs)
    start = time.perf_counter()
    env_verdicts = [(await e.score()).reward == 1.0 for e in episodes]
    env_s = time.perf_counter() - start
    env_agree = sum(a == b for a, b in zip(env_verdicts, reference, strict=True))
    stalls = []
    for _ in range(args.repeats):
        _clear_caches()
        env.pool._cache.clear()
        episodes = await _env_scores(env, pairs)
        stalls.append((await _gathered_stall([e.score() for e in episodes]))[1])
    stalls.sort()
    idle = sorted([(await _gathered_stall([asyncio.sleep(0.05)]))[1] for _ in range(args.repeats)])
    patho_start = time.perf_counter()
    patho = await verify_answer("1", "9^{9^{9^{9}}}", env.pool)
    patho_s = time.perf_counter() - patho_start
    await env.aclose()

    table = Table(title=f"math grading, {n} answers one after another ({sum(not r for r in reference)} wrong)")
    for col in ("grader", "answers/s", "agrees with math-verify", "decided without sympy", "worst stall ms"):
        table.add_column(col, justify="right")
    for name, rate, agreed, no_sympy, stall_text in rows:
        table.add_row(
            name,
            f"{rate:.0f}",
            f"{agreed}/{n} ({agreed / n:.1%})",
            "-" if no_sympy is None else f"{no_sympy}/{n}",
            stall_text,
        )
    table.add_row(
        "ours: verify_answer (cold caches)",
        f"{n / elapsed:.0f}",
        f"{agree}/{n} ({agree / n:.1%})",
        f"{decided}/{n}",
        "-",
    )
    table.add_row(
        f"ours: math env score() ({args.workers} workers)",
        f"{n / env_s:.0f}",
        f"{env_agree}/{n} ({env_agree / n:.1%})",
        f"{decided}/{n}",
        f"{stalls[len(stalls) // 2] * 1000:.1f} median, {stalls[-1] * 1000:.1f} worst of {len(stalls)} batches",
    )
    table.add_row(
        "an idle loop (the machine's noise)",
        "-",
        "-",
        "-",
        f"{idle[len(idle) // 2] * 1000:.1f} median, {idle[-1] * 1000:.1f} worst",
    )
    table.add_row("ours: pathological 9^{9^{9^{9}}}", "-", "-", "-", f"{patho_s:.2f} s, verdict: {patho.method}")
    Console(width=150).print(table)
    disagreements = [(g, p, r) for (g, p), v, r in zip(pairs, verdicts, reference, strict=True) if v != r]
    for gold, pred, ref in disagreements[:10]:
        print(f"disagrees: gold {gold!r} pred {pred!r} (math-verify: {ref})")


if __name__ == "__main__":
    asyncio.run(main())
