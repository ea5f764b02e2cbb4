"""Automatic cache breakpoints, only_call_in_flight: where one goes, and that a client's own win."""

from __future__ import annotations

from typing import Any

from gateway.caching.breakpoints import add_chat_breakpoint, add_messages_breakpoint

MARK = {"type": "ephemeral"}
TOOL = {"name": "f", "input_schema": {"type": "object"}}


def test_a_string_system_prompt_becomes_one_marked_block() -> None:
    body: dict[str, Any] = {"system": "Policy.", "tools": [TOOL], "messages": [{"role": "user", "content": "Hi"}]}
    assert add_messages_breakpoint(body)
    assert body["system"] == [{"type": "text", "text": "Policy.", "cache_control": MARK}]
    assert body["tools"] == [TOOL]


def test_the_last_system_block_is_marked_else_the_last_tool() -> None:
    blocks = [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]
    body: dict[str, Any] = {"system": blocks, "messages": []}
    assert add_messages_breakpoint(body)
    assert body["system"] == [blocks[0], {**blocks[1], "cache_control": MARK}] and "cache_control" not in blocks[1]
    tools_only: dict[str, Any] = {"tools": [TOOL, TOOL], "messages": []}
    assert add_messages_breakpoint(tools_only) and tools_only["tools"] == [TOOL, {**TOOL, "cache_control": MARK}]
    assert not add_messages_breakpoint({"messages": [{"role": "user", "content": "Hi"}]})


def test_a_client_breakpoint_anywhere_means_none_is_added() -> None:
    own = {"type": "ephemeral", "ttl": "1h"}
    for body in ({"system": "S", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": own}]}]},
                 {"system": "S", "tools": [{**TOOL, "cache_control": own}], "messages": []},
                 {"system": "S", "cache_control": own, "messages": []}):
        before = repr(body)
        assert not add_messages_breakpoint(body)
        assert repr(body) == before


def test_a_chat_request_has_its_last_system_message_marked() -> None:
    body: dict[str, Any] = {"messages": [{"role": "system", "content": "A"}, {"role": "developer", "content": "B"},
                                         {"role": "user", "content": "Hi"}]}
    assert add_chat_breakpoint(body)
    assert body["messages"][1] == {"role": "developer", "content": [{"type": "text", "text": "B", "cache_control": MARK}]}
    assert body["messages"][0] == {"role": "system", "content": "A"}
    marked = {"messages": [{"role": "system", "content": [{"type": "text", "text": "A", "cache_control": MARK}]}]}
    assert not add_chat_breakpoint(marked)
    assert not add_chat_breakpoint({"messages": [{"role": "user", "content": "Hi"}]})
