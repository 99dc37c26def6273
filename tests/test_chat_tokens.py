"""Observation tokens are exactly the chat template's text for them, rendered once."""

from __future__ import annotations

from aclarena_slime.chat_tokens import ChatTokens


def test_prompt_then_turns_reproduce_the_template(tiny_tokenizer):
    chat = ChatTokens(tiny_tokenizer)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "find it"}]
    ids = chat.prompt_ids(messages, tools)
    turn = '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'
    model_ids = chat.encode(turn) + [tiny_tokenizer.eos_token_id]
    observation = [{"role": "tool", "content": "found"}]
    ids += model_ids + chat.observation_ids(observation, model_ids[-1])
    full = messages + [{"role": "assistant", "content": turn}] + observation
    assert tiny_tokenizer.decode(ids) == chat.render(full, tools, add_generation_prompt=True)


def test_turn_without_end_token_gets_the_closing_text(tiny_tokenizer):
    chat = ChatTokens(tiny_tokenizer)
    text = chat.observation_text([{"role": "user", "content": "obs"}], last_model_token=chat.encode("x")[-1])
    assert text == "<|im_end|>\n<|im_start|>user\nobs<|im_end|>\n<|im_start|>assistant\n"
    text = chat.observation_text([{"role": "user", "content": "obs"}], last_model_token=tiny_tokenizer.eos_token_id)
    assert text == "\n<|im_start|>user\nobs<|im_end|>\n<|im_start|>assistant\n"


def test_template_that_rewrites_history_still_gives_the_observation(tiny_tokenizer):
    """Qwen3's template drops thinking from earlier turns; only the text after our turn counts."""
    chat = ChatTokens(tiny_tokenizer)
    rewriting = tiny_tokenizer.chat_template.replace(
        "(message.content or '')",
        "((message.content or '').split('</think>')[-1] if not loop.last else message.content)",
    )
    chat.kwargs = {"chat_template": rewriting}
    text = chat.observation_text([{"role": "user", "content": "next"}], tiny_tokenizer.eos_token_id)
    assert text == "\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
