"""A prompt's size: the bound is there at once and never below the count; the count is
only computed when asked for, and then once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.tokens.counting import Tokenizers
from gateway.tokens.prompt_size import PromptSize, estimate_prompt_tokens

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
BODIES: list[tuple[str, dict[str, Any]]] = [
    ("chat.completions", {"model": "m", "messages": [{"role": "user", "content": "Wie spät ist es in Zürich? 🕰️"}]}),
    ("chat.completions", {"model": "m", "messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS}),
    ("completions", {"model": "m", "prompt": "Once upon a time"}),
    ("completions", {"model": "m", "prompt": ["first prompt", "second, longer prompt"]}),
    ("completions", {"model": "m", "prompt": [101, 2023, 2003, 1037]}),
    ("embeddings", {"model": "m", "input": [[1, 2, 3], [4, 5]]}),
    ("embeddings", {"model": "m", "input": "embed me"}),
]


@pytest.mark.parametrize(("endpoint", "body"), BODIES)
def test_count_on_demand_and_bound_above_it(endpoint: str, body: dict[str, Any]) -> None:
    tokenizers = Tokenizers()
    size = PromptSize(endpoint, body, "o200k_base", tokenizers)
    assert size.counted is None and size.best == size.bound
    counted = asyncio.run(size.count())
    assert counted == estimate_prompt_tokens(endpoint, body, "o200k_base")
    assert size.counted == size.best == counted
    assert size.bound >= counted


def test_token_ids_count_as_themselves() -> None:
    size = PromptSize("completions", {"prompt": [101, 2023, 2003, 1037]}, "o200k_base", Tokenizers())
    assert size.bound == 4 and asyncio.run(size.count()) == 4


def test_nothing_is_loaded_until_a_count_is_asked_for() -> None:
    tokenizers = Tokenizers()
    PromptSize(*BODIES[0], "o200k_base", tokenizers)
    assert tokenizers.loaded("o200k_base") is None
