"""The ACLArena authors' format-shaped search reward, from -0.2 to 1.0 (beside plain EM / F1).

The table of ``qa_em_format_qwen_sft_8b.py`` (lines 24-34 and 81-121 in WillDreamer/ACLArena
``slime/examples/search-r1/``), the scorer ``run_qwen3_8b_seq_search.sh`` uses through
``generate_with_search_tools_qwen_sft_no_drift.py`` (line 70). A correct answer is checked first and
is never vetoed by truncation:

=====================================================  =======
correct, well formed, a search returned passages         1.0
correct, a search returned passages, malformed           0.7
correct, well formed, no search                          0.5
correct, malformed, no search                            0.3
truncated (no answer), a search returned passages       -0.05
truncated (no answer), no search                        -0.2
wrong, well formed, a passage holds a gold answer        0.4
wrong, well formed, searched (no gold in passages)       0.1
wrong, well formed, no search                           -0.05
wrong, malformed                                        -0.2
=====================================================  =======

"Truncated" is the authors' TRUNCATED status: the episode ended without an answer (response budget,
turn limit, or a turn with no action). "A search returned passages" is their ``executed_tool_call``
(a non-empty ``<tool_response>``); "a passage holds a gold answer" is their ``is_retrieval_correct``
(normalised gold answer inside a normalised tool response, lines 167-179 of ``qa_em_format_qwen_sft.py``).
Correctness is exact match after the same normalisation as :func:`.reward.normalize_answer`.

``reward: shaped`` is that table as documented. ``reward: shaped_effective`` is the same table as the
authors' code effectively computes it (:func:`effective_reward`): their scorer reads the answer from
prompt + response (``no_drift.py:935``), takes the last ``<answer>...</answer>`` pair there and gives
none only when there are at most one (``qa_em_format_qwen_sft.py:161-167``), and their prompt already
holds two pairs (``<answer> and </answer>``, ``<answer> Beijing </answer>``). So an episode without an
answer of its own is answered "Beijing" (the -0.05 branch never fires: -0.2, or a "correct" 0.3/0.7
when the gold answer is Beijing), and an ``<answer>`` written in a search turn's thinking pairs with
the final ``</answer>`` into one wrong answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .reward import exact_match, normalize_answer

SHAPED_RANGE = (-0.2, 1.0)
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"


@dataclass(frozen=True)
class ShapedInputs:
    """What the table reads from an episode."""

    answer: str | None  # the model's answer; None when the episode ended without one (truncated)
    golds: list[str]
    well_formed: bool  # the authors' tag-sequence rule over the whole trajectory
    executed: bool  # a search returned at least one passage
    retrieved_texts: list[str]  # the tool responses the model saw


def retrieval_correct(texts: Iterable[str], golds: Iterable[str]) -> bool:
    """Whether some normalised gold answer occurs inside some normalised tool response."""
    normalised_golds = [g for g in (normalize_answer(gold) for gold in golds) if g]
    return any(g in normalize_answer(text) for text in texts for g in normalised_golds)


def shaped_reward(inputs: ShapedInputs) -> float:
    """The authors' table (see the module docstring); always within :data:`SHAPED_RANGE`."""
    correct = bool(inputs.answer) and exact_match(inputs.answer or "", inputs.golds) == 1.0
    if correct:
        if inputs.executed:
            return 1.0 if inputs.well_formed else 0.7
        return 0.5 if inputs.well_formed else 0.3
    if inputs.answer is None:  # truncated: no positive shaping
        return -0.05 if inputs.executed else -0.2
    if not inputs.well_formed:
        return -0.2
    if inputs.executed and retrieval_correct(inputs.retrieved_texts, inputs.golds):
        return 0.4
    return 0.1 if inputs.executed else -0.05


def authors_answer(text: str) -> str | None:
    """The authors' ``extract_solution``: the last ``<answer>...</answer>`` pair of ``text`` (each pair
    from an opening tag to the next closing one, left to right), stripped; None with fewer than two.

    Linear in the text (``str.find``), the same pairs as their non-greedy regex.
    """
    found: list[str] = []
    pos = 0
    while (start := text.find(ANSWER_OPEN, pos)) >= 0:
        end = text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end < 0:
            break
        found.append(text[start + len(ANSWER_OPEN) : end])
        pos = end + len(ANSWER_CLOSE)
    return found[-1].strip() if len(found) > 1 else None


def effective_reward(inputs: ShapedInputs, truncated: bool) -> float:
    """The authors' scorer as it runs (``qa_em_format_qwen_sft_8b.py:68-121``): ``inputs.answer`` is
    :func:`authors_answer` over prompt + trajectory, ``truncated`` their TRUNCATED status (no answer
    turn: budget, turn limit, or a turn with no action)."""
    answer = inputs.answer
    if answer and exact_match(answer, inputs.golds) == 1.0:
        if inputs.executed:
            return 1.0 if inputs.well_formed else 0.7
        return 0.5 if inputs.well_formed else 0.3
    if truncated:
        return -0.05 if inputs.executed and answer is None else -0.2
    if not inputs.well_formed:
        return -0.2
    if inputs.executed and retrieval_correct(inputs.retrieved_texts, inputs.golds):
        return 0.4
    return 0.1 if inputs.executed else -0.05
