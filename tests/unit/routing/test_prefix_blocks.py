"""The router's block hashes: a shared prompt head gives shared leading blocks, the
tenant's salt separates tenants from the first block on, and the request body is read
the way a replica prefills it."""

from __future__ import annotations

from gateway.routing.prefix_blocks import BYTES_PER_TOKEN, block_hashes, prompt_text
from gateway.routing.prefix_index import PrefixIndex

SYSTEM = "You are the support assistant of a bicycle shop. " * 20


def chat(question: str, system: str = SYSTEM) -> str:
    return prompt_text("chat.completions", {"messages": [{"role": "system", "content": system},
                                                          {"role": "user", "content": question}]})


def test_requests_sharing_a_system_prompt_share_its_blocks_and_no_more() -> None:
    a = block_hashes(chat("Where is my order? " * 8), "salt-acme")
    b = block_hashes(chat("Do you sell helmets? " * 8), "salt-acme")
    shared = len(SYSTEM.encode()) // (16 * BYTES_PER_TOKEN)
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert common >= shared - 1
    assert a[:common] == b[:common] and a[common] != b[common]


def test_two_tenants_identical_prompts_share_no_block() -> None:
    a = block_hashes(chat("Where is my order?"), "salt-acme")
    b = block_hashes(chat("Where is my order?"), "salt-globex")
    assert len(a) == len(b) > 10
    assert not set(a) & set(b)


def test_only_full_blocks_count() -> None:
    assert block_hashes("x" * (16 * BYTES_PER_TOKEN - 1), "s") == []
    assert len(block_hashes("x" * (16 * BYTES_PER_TOKEN * 3 + 5), "s")) == 3
    assert len(block_hashes("x" * 320, "s", block_tokens=32)) == 2


def test_prompt_text_follows_prefix_order_for_each_endpoint() -> None:
    tools = [{"type": "function", "function": {"name": "lookup"}}]
    with_tools = prompt_text("chat.completions", {"messages": [{"role": "user", "content": "hi"}], "tools": tools})
    assert with_tools.startswith("tools\x00") and with_tools.index("lookup") < with_tools.index("hi")
    parts = prompt_text("chat.completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                        {"type": "text", "text": "b"}]}]})
    assert "ab" in parts
    assert prompt_text("completions", {"prompt": "once upon"}) == "once upon"
    assert prompt_text("completions", {"prompt": [1, 2, 3]}) == "1 2 3"
    assert prompt_text("embeddings", {"input": "x"}) == ""


def test_the_index_remembers_a_prompts_head_longest() -> None:
    index = PrefixIndex()
    index.resize("r", 12)
    first = block_hashes(chat("Where is my order?"), "s")  # ~17 blocks: more than the index holds
    index.record("r", first)
    assert index.size("r") == 12
    assert index.matched("r", first) == 12, "the tail is forgotten first, so the head still matches"
    index.forget("r")
    assert index.matched("r", first) == 0
