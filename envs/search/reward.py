"""Scoring an answer against gold answers: exact match, token F1, and Search-R1's format score.

Normalisation is the SQuAD/Search-R1 one (lower-case, drop punctuation, drop the articles a/an/the,
collapse whitespace; ``verl/utils/reward_score/qa_em.py`` in Search-R1). The format score follows
Search-R1's ``qa_em_format.py``: a well-formed trajectory with a wrong answer earns ``format_score``,
a right answer in a malformed trajectory loses it.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

# shaped: the authors' table as documented; shaped_effective: as their code computes it (shaped_reward.py,
# tool_call protocol)
REWARDS = ("em", "f1", "shaped", "shaped_effective")

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation and articles, collapse whitespace (in that order)."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(prediction: str, golds: Iterable[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def f1(prediction: str, golds: Iterable[str]) -> float:
    """The best token-level F1 over the gold answers (SQuAD's definition)."""
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        gold_tokens = normalize_answer(gold).split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common:
            precision, recall = common / len(pred_tokens), common / len(gold_tokens)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def trajectory_reward(correctness: float, well_formed: bool, format_score: float) -> float:
    """Combine answer correctness (EM or F1, in [0, 1]) with the format bonus, Search-R1 style.

    A correct answer scores ``1 - format_score`` unless the trajectory was well formed; a wrong one
    scores ``format_score`` if it was. With ``format_score = 0`` this is plain EM/F1.
    """
    if well_formed:
        return max(correctness, format_score)
    return correctness * (1.0 - format_score)


def gold_answers(label: object) -> list[str]:
    """The gold answers of a label: ``{"target": [...]}`` (Search-R1), a list, or one string.

    Raises ValueError with the label in the message when there is no usable answer: a dataset
    problem must be loud, not a silent reward of 0.
    """
    target = label.get("target", label.get("golden_answers")) if isinstance(label, dict) else label
    if isinstance(target, str):
        target = [target]
    usable = isinstance(target, (list, tuple)) and target
    if not usable or not all(isinstance(t, (str, int, float)) and str(t).strip() for t in target):
        raise ValueError(f'search label needs gold answers as {{"target": ["..."]}}, got {label!r}')
    return [str(t) for t in target]
