"""Every IFEval instruction id, strict and loose, on responses that pass and responses that fail.

Expected verdicts follow the reference implementation's rules (google-research
instruction_following_eval: ``instructions.py`` and ``evaluation_lib.py``); the cases are ours.
"""

from __future__ import annotations

import pytest

from aclarena_envs.ifeval.checkers import INSTRUCTIONS, LabelError, build_checker
from aclarena_envs.ifeval.reward import Label, judge

LOWER_EN = "the quick brown fox jumps over the lazy dog because it wants to see the river and the garden today."
UPPER_EN = LOWER_EN.upper()
PROSE = "We walked to the harbor at dawn. The boats were quiet. Nobody spoke for a while."

# (instruction id, kwargs, response, strict verdict, loose verdict)
CASES = [
    ("keywords:existence", {"keywords": ["harbor", "Boats"]}, PROSE, True, True),
    ("keywords:existence", {"keywords": ["harbor", "lantern"]}, PROSE, False, False),
    (
        "keywords:frequency",
        {"keyword": "tea", "frequency": 2, "relation": "at least"},
        "Tea, then more tea.",
        True,
        True,
    ),
    (
        "keywords:frequency",
        {"keyword": "tea", "frequency": 2, "relation": "less than"},
        "Tea, then more tea.",
        False,
        False,
    ),
    ("keywords:frequency", {"keyword": "tea", "frequency": 1, "relation": "at least"}, "I steam milk.", True, True),
    ("keywords:forbidden_words", {"forbidden_words": ["river"]}, "The riverbank was wide.", True, True),
    ("keywords:forbidden_words", {"forbidden_words": ["river"]}, "The River was wide.", False, False),
    (
        "keywords:forbidden_words",
        {"forbidden_words": ["bold"]},
        "Title line\nThis is **bold** text.\nEnd",
        False,
        False,
    ),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 2, "let_relation": "at least"},
        "Zig zag.",
        True,
        True,
    ),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 2, "let_relation": "less than"},
        "Zig zag.",
        False,
        False,
    ),
    ("keywords:letter_frequency", {"letter": "#", "let_frequency": 2, "let_relation": "at least"}, "#a #b", True, True),
    (
        "language:response_language",
        {"language": "de"},
        "Das ist ein kurzer Satz über das Wetter in Berlin und den Regen.",
        True,
        True,
    ),
    ("language:response_language", {"language": "de"}, PROSE, False, False),
    ("language:response_language", {"language": "fr"}, "12345 !!!", True, True),  # undecidable counts as followed
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "at least"}, PROSE, True, True),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, PROSE, False, False),
    # Punkt knows "Dr." and "p.m." are not sentence ends: two sentences, not four.
    (
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "less than"},
        "Dr. Lee left at 5 p.m. on Friday. She was tired.",
        True,
        True,
    ),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 2, "relation": "less than"},
        "Sure! Here it is.\nOne sentence only.",
        False,
        True,
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "at least"},
        "one two three four five",
        True,
        True,
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "less than"},
        "one two three four five",
        False,
        False,
    ),
    (
        "length_constraints:number_words",
        {"num_words": 3, "relation": "less than"},
        "Sure thing:\ndon't\nok",
        False,
        True,
    ),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First part.\n***\nSecond part.", True, True),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        "***\nFirst part.\n***\nSecond part.\n***",
        True,
        True,
    ),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First.\n***\n\n***\nSecond.", False, False),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "One.\n***\nTwo.\n***\nThree.", False, True),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "Then"},
        'We began.\n\n"Then, we ended.',
        True,
        True,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
        "We began.\n\nAfter that we ended.",
        False,
        False,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "alpha"},
        "Here you go\nAlpha is first.\n\nBeta is second.",
        False,
        True,
    ),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], see you at [place].", True, True),
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 3},
        "Dear [name], see you at [place].",
        False,
        False,
    ),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Bye.\n\np. s. see you soon", True, True),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Bye.\nP.P.S. one more thing", True, True),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Bye.\nP.S. one more thing", False, False),
    ("detectable_content:postscript", {"postscript_marker": "Note:"}, "Body.\nNOTE: later", True, True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "List:\n* one\n- two", True, True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "List:\n* one\n* two\n* three", False, True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 1}, "**Bold** start\n* item", True, True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 1}, "No bullets at all.", False, False),
    ("detectable_format:constrained_response", {}, "Hmm. My answer is maybe.", True, True),
    ("detectable_format:constrained_response", {}, "My answer is probably.", False, False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and *two*", True, True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 1}, "**bold** here", True, True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "**bold** here", False, False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and ** ** and *\n*", False, False),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nA\nSection 2\nB",
        True,
        True,
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "SECTION 1\nA\nSECTION 2\nB",
        False,
        False,
    ),
    ("detectable_format:json_format", {}, '```json\n{"a": [1, 2]}\n```', True, True),
    ("detectable_format:json_format", {}, 'Here is JSON: {"a": 1}', False, False),
    ("detectable_format:json_format", {}, 'Here is the JSON:\n{"a": 1}', False, True),
    ("detectable_format:json_format", {}, "[" * 100_000 + "]" * 100_000, False, False),
    ("detectable_format:title", {}, "<<A Quiet Harbor>>\nText.", True, True),
    ("detectable_format:title", {}, "<<  >> and <<broken\ntitle>>", False, False),
    ("combination:two_responses", {}, "First answer.\n******\nSecond answer.", True, True),
    ("combination:two_responses", {}, "Same.\n******\nSame.", False, False),
    ("combination:two_responses", {}, "A\n******\n\n******\nB", False, False),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem about rain."},
        "write a poem about rain. Rain falls.",
        True,
        True,
    ),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem about rain."},
        "Sure! Write a poem about rain.",
        False,
        False,
    ),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem about rain."},
        "Sure, here it is:\nWrite a poem about rain. Drops.",
        False,
        True,
    ),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, '"Done. any other questions?"  ', True, True),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Any other questions? Bye.", False, False),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. Any other questions?\n---", False, True),
    ("startend:quotation", {}, '  "Quoted."  ', True, True),
    ("startend:quotation", {}, '"', False, False),
    ("startend:quotation", {}, 'Here:\n"Quoted."', False, True),
    ("change_case:english_capital", {}, UPPER_EN, True, True),
    ("change_case:english_capital", {}, UPPER_EN + " x", False, False),
    (
        "change_case:english_capital",
        {},
        "DAS IST EIN KURZER SATZ ÜBER DAS WETTER IN BERLIN UND DEN REGEN.",
        False,
        False,
    ),
    ("change_case:english_capital", {}, "Sure:\n" + UPPER_EN, False, True),
    ("change_case:english_lowercase", {}, LOWER_EN, True, True),
    ("change_case:english_lowercase", {}, "The " + LOWER_EN, False, False),
    ("change_case:english_lowercase", {}, LOWER_EN + "\nBye!", False, True),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "I DON'T know.",
        True,
        True,
    ),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "less than"},
        "I DON'T know.",
        False,
        False,
    ),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "Big-TIME fun.",
        False,
        False,
    ),
    ("punctuation:no_comma", {}, "No commas here.", True, True),
    ("punctuation:no_comma", {}, "Yes, commas.", False, False),
    ("punctuation:no_comma", {}, "Sure, here it is:\nNo commas here.", False, True),
]


@pytest.mark.parametrize(("instruction_id", "kwargs", "response", "strict", "loose"), CASES)
def test_verdicts(instruction_id: str, kwargs: dict, response: str, strict: bool, loose: bool) -> None:
    label = Label((instruction_id,), (kwargs,))
    verdicts = judge(label, response)
    assert verdicts.strict == (strict,)
    assert verdicts.loose == (loose,)


def test_every_id_passes_and_fails_in_both_modes() -> None:
    for instruction_id in INSTRUCTIONS:
        outcomes = {(strict, loose) for i, _, _, strict, loose in CASES if i == instruction_id}
        assert (True, True) in outcomes, f"{instruction_id} has no passing case"
        assert (False, False) in outcomes, f"{instruction_id} has no failing case"
    assert len(INSTRUCTIONS) == 25


@pytest.mark.parametrize("instruction_id", sorted(INSTRUCTIONS))
def test_blank_response_follows_nothing(instruction_id: str) -> None:
    kwargs = next(k for i, k, *_ in CASES if i == instruction_id)
    assert judge(Label((instruction_id,), (kwargs,)), "  \n ").strict == (False,)


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "message"),
    [
        ("keywords:nonsense", {}, "unknown IFEval instruction id"),
        ("keywords:frequency", {"keyword": "tea", "frequency": 2}, "missing kwarg 'relation'"),
        ("keywords:frequency", {"keyword": "tea", "frequency": 2, "relation": "at most"}, "must be one of"),
        ("keywords:frequency", {"keyword": "tea", "frequency": "two", "relation": "at least"}, "must be an integer"),
        ("keywords:frequency", {"keyword": "tea", "frequency": 2.5, "relation": "at least"}, "whole number"),
        (
            "keywords:letter_frequency",
            {"letter": "ab", "let_frequency": 1, "let_relation": "at least"},
            "one character",
        ),
        ("keywords:existence", {"keywords": "tea"}, "list of strings"),
        ("punctuation:no_comma", {"strict": True}, "unknown kwargs"),
        ("language:response_language", {"language": "xx"}, "must be one of"),
        (
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "a"},
            "beyond num_paragraphs",
        ),
    ],
)
def test_bad_kwargs_are_errors(instruction_id: str, kwargs: dict, message: str) -> None:
    with pytest.raises(LabelError, match=message):
        build_checker(instruction_id, kwargs)


def test_null_kwargs_are_absent() -> None:
    # The Hugging Face copy of IFEval fills every kwarg slot with null.
    checker = build_checker("punctuation:no_comma", {"num_words": None, "relation": None})
    assert checker.check("fine") and not checker.check("a, b")
