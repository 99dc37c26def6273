"""Reading Qwen3 tool calls out of model text; anything unreadable is a MalformedCall, never an exception."""

from __future__ import annotations

import pytest

from aclarena_envs.retail.tool_calls import MalformedCall, ToolCall, ToolCallParser

parse = ToolCallParser().parse


def test_calls_and_content_in_order():
    turn = parse(
        'Let me check.\n<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>'
        '<tool_call>{"name": "list_all_product_types", "arguments": "{}"}</tool_call>'
    )
    assert turn.content == "Let me check."
    assert turn.calls == [ToolCall("get_order_details", {"order_id": "#W1"}), ToolCall("list_all_product_types", {})]


def test_thinking_is_not_content_and_its_calls_do_not_count():
    turn = parse('<think>maybe <tool_call>{"name": "x", "arguments": {}}</tool_call></think>\n\nHello! How can I help?')
    assert turn.calls == [] and turn.content == "Hello! How can I help?"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>["get_user_details"]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "calculate", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "calculate", "arguments": "[1"}</tool_call>', "not a JSON object"),
        ('<tool_call>{"name": "calculate", "arguments": {}}', "without a closing </tool_call>"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>', "lone surrogate"),
        ('<tool_call>{"name": "calculate", "arguments": {"expression": "\\udfff"}}</tool_call>', "lone surrogate"),
        ('<tool_call>{"name": "calculate", "arguments": "{\\"x\\": \\"\\\\ud800\\"}"}</tool_call>', "lone surrogate"),
        ('<tool_call>{"name": "' + "n" * 101 + '", "arguments": {}}</tool_call>', "101 characters long"),
    ],
)
def test_malformed_calls_become_errors(text, error):
    (call,) = parse(text).calls
    assert isinstance(call, MalformedCall) and error in call.error


def test_tags_are_configurable():
    parser = ToolCallParser.from_config({"open": "<function_call>", "close": "</function_call>"})
    turn = parser.parse('<function_call>{"name": "calculate", "arguments": {"expression": "1+1"}}</function_call>')
    assert turn.calls == [ToolCall("calculate", {"expression": "1+1"})]
    assert parser.parse('<tool_call>{"name": "calculate"}</tool_call>').calls == []
    with pytest.raises(ValueError, match="unknown tool_call_format keys"):
        ToolCallParser.from_config({"opening": "<x>"})
