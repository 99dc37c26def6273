"""Short answers that follow a generated prompt's instructions: gold demos for the local SFT warm start.

:func:`demo_turns` writes, for a record made by :mod:`aclarena_envs.ifeval.generator`, one short
response built instruction by instruction from the label's kwargs (a title, the keywords, so many
bullets, the end phrase, ...), tries a second wording when the first breaks an instruction, and
returns the one the env's own judge accepts (or its last attempt, which the replay's reward filter
then drops). It covers what a short answer can: "at least 300 words" or "answer in Hindi" prompts
get no demo. The answers are about nothing; they teach the format, which is what IFEval checks.
"""

from __future__ import annotations

import json
from typing import Any

from aclarena_envs.ifeval.reward import Label, judge

_BASES = ("this is my answer", "here it is")


def demo_turns(record: dict[str, Any]) -> list[str]:
    """The one model turn of a gold trajectory for ``record`` (the local backend replays it)."""
    label = Label.parse(record["label"])
    attempt = ""
    for base in _BASES:
        attempt = compose(label, base)
        if all(judge(label, attempt).followed("strict")):
            break
    return [attempt]


def compose(label: Label, base: str) -> str:
    """A response following ``label``'s instructions as far as a short answer can, built on ``base``."""
    todo = dict(zip(label.instruction_ids, label.kwargs, strict=True))
    if "detectable_format:constrained_response" in todo:
        return "My answer is yes."
    sentence = [base]
    if (kw := todo.get("keywords:existence")) is not None:
        sentence += list(kw["keywords"])
    if (kw := todo.get("keywords:frequency")) is not None and kw["relation"] == "at least":
        sentence += [kw["keyword"]] * int(kw["frequency"])
    if (kw := todo.get("keywords:letter_frequency")) is not None and kw["let_relation"] == "at least":
        sentence.append(str(kw["letter"]) * int(kw["let_frequency"]))
    if (kw := todo.get("change_case:capital_word_frequency")) is not None and kw["capital_relation"] == "at least":
        sentence += ["OK"] * int(kw["capital_frequency"])
    if (kw := todo.get("detectable_content:number_placeholders")) is not None:
        sentence += ["[name]"] * int(kw["num_placeholders"])
    if (kw := todo.get("detectable_format:number_highlighted_sections")) is not None:
        sentence += ["*note*"] * int(kw["num_highlights"])
    text = " ".join(sentence) + "."
    if (kw := todo.get("length_constraints:number_sentences")) is not None and kw["relation"] == "at least":
        text += " It is short." * (int(kw["num_sentences"]) - 1)
    if (kw := todo.get("length_constraints:number_words")) is not None and kw["relation"] == "at least":
        text += " word" * int(kw["num_words"])
    text = _shaped(todo, text)
    if (kw := todo.get("detectable_content:postscript")) is not None:
        text += f"\n\n{kw['postscript_marker']} see above."
    if (kw := todo.get("startend:end_checker")) is not None:
        text += f" {kw['end_phrase']}"
    if "detectable_format:title" in todo:
        text = f"<<my answer>>\n{text}"
    if (kw := todo.get("combination:repeat_prompt")) is not None:
        text = f"{kw['prompt_to_repeat']}\n{text}"
    if "combination:two_responses" in todo:
        text = f"{text}\n******\n{text} Again."
    if "detectable_format:json_format" in todo:
        text = json.dumps({"answer": text})
    if "startend:quotation" in todo:
        text = f'"{text}"'
    if "change_case:english_lowercase" in todo:
        text = text.lower()
    if "change_case:english_capital" in todo:
        text = text.upper()
    return text


def _shaped(todo: dict[str, dict[str, Any]], text: str) -> str:
    """The text laid out as the bullets, sections or paragraphs the instructions ask for."""
    if (kw := todo.get("detectable_format:number_bullet_lists")) is not None:
        text += "\n" + "\n".join(["* point"] * int(kw["num_bullets"]))
    if (kw := todo.get("detectable_format:multiple_sections")) is not None:
        word = kw["section_spliter"].strip()
        text = "\n".join(f"{word} {i + 1}\n{text}" for i in range(int(kw["num_sections"])))
    if (kw := todo.get("length_constraints:number_paragraphs")) is not None:
        text = "\n***\n".join([text] * int(kw["num_paragraphs"]))
    if (kw := todo.get("length_constraints:nth_paragraph_first_word")) is not None:
        paragraphs = [text] * int(kw["num_paragraphs"])
        nth = int(kw["nth_paragraph"]) - 1
        paragraphs[nth] = f"{kw['first_word']} {paragraphs[nth]}"
        text = "\n\n".join(paragraphs)
    return text
