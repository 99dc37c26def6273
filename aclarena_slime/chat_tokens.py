"""Turning chat messages into token ids the way the chat template renders them, once per turn.

The prompt is rendered with the generation prompt. An observation (messages the env appends after a
model turn) becomes exactly the template's text between the end of the model's turn and the next
generation prompt. We find that span by rendering a fixed stand-in conversation with and without the
observation, around a sentinel assistant message; this works for templates that re-render history
(Qwen3 strips earlier thinking), because only the text after the sentinel is used.
"""

from __future__ import annotations

from typing import Any

_SENTINEL = "ACLARENA-TURN-SENTINEL"
_STAND_IN = [{"role": "user", "content": "ACLARENA-USER"}, {"role": "assistant", "content": _SENTINEL}]


class ChatTemplateError(ValueError):
    pass


class ChatTokens:
    """Renders prompts and observations of one tokenizer; model tokens are never re-tokenized."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self.special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt, **self.kwargs
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def observation_text(self, observation: list[dict[str, Any]], last_model_token: int | None) -> str:
        """The template's text for ``observation``, minus what the model already generated.

        If the model's turn ended with an end-of-turn special token (``<|im_end|>``), the template's own
        copy of it is dropped; if it stopped on a stop string instead, the closing tokens are part of the
        observation (the model did not write them, so they are not trained on).
        """
        full = self.render(_STAND_IN + list(observation), None, add_generation_prompt=True)
        at = full.find(_SENTINEL)
        if at < 0:
            raise ChatTemplateError("the chat template dropped the assistant turn; cannot place the observation")
        text = full[at + len(_SENTINEL) :]
        if last_model_token is not None and last_model_token in self.special_ids:
            end = self.tokenizer.decode([last_model_token])
            if end and text.startswith(end):
                text = text[len(end) :]
        return text

    def observation_ids(self, observation: list[dict[str, Any]], last_model_token: int | None) -> list[int]:
        return self.encode(self.observation_text(observation, last_model_token))

    def turn_text(self, token_ids: list[int]) -> str:
        """The model's turn as the env sees it: special tokens removed, markup such as ``<think>`` kept."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)
