"""Which prompt size a budget hold covers: the tiktoken count only for a model whose
provider is declared to count with that very encoding, once the prompt is counted;
the bound for any tokenizer everywhere else."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.accounting.hold_and_settle import counts_like_provider, hold_prompt_tokens
from gateway.routing.policy import Policy
from gateway.routing.resolved import RuntimePolicy
from gateway.tokens.counting import Tokenizers
from gateway.tokens.prompt_size import PromptSize

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Name three rivers that flow through Europe. " * 10}]}


def runtime(**model: Any) -> RuntimePolicy:
    return RuntimePolicy(Policy.model_validate({
        "version": 1,
        "defaults": {"prompt_margin_ratio": "0.02", "prompt_margin_tokens": 8},
        "upstreams": {"hosted": {"kind": "openai", "base_url": "https://api.example.com/v1"}},
        "models": {"m": {"upstream": "hosted", "price": {"input": 1, "output": 1}, **model}},
    }))


def counted(body: dict[str, Any], encoding: str = "o200k_base") -> PromptSize:
    size = PromptSize("chat.completions" if "messages" in body else "completions", body, encoding, Tokenizers())
    asyncio.run(size.count())
    return size


def test_an_undeclared_tokenizer_is_unknown_and_holds_the_bound_even_when_counted() -> None:
    policy = runtime()
    size = counted(CHAT)
    assert size.counted is not None and size.counted < size.bound
    assert not counts_like_provider(size, policy, policy.targets["m"])
    assert hold_prompt_tokens(size, policy, policy.targets["m"]) == size.bound


def test_a_provider_counting_in_the_same_encoding_holds_the_count_and_its_margin() -> None:
    policy = runtime(tokenizer="o200k_base", provider_tokenizer="tiktoken")
    target = policy.targets["m"]
    fresh = PromptSize("chat.completions", CHAT, "o200k_base", Tokenizers())
    assert counts_like_provider(fresh, policy, target)
    assert hold_prompt_tokens(fresh, policy, target) == fresh.bound, "not counted yet: the bound"
    size = counted(CHAT)
    assert size.counted is not None
    assert hold_prompt_tokens(size, policy, target) == size.counted + size.counted * 2 // 100 + 8


def test_a_count_in_another_encoding_than_the_providers_is_not_used() -> None:
    policy = runtime(tokenizer="cl100k_base", provider_tokenizer="tiktoken")
    size = counted(CHAT, "o200k_base")  # e.g. a route whose default encoding differs from this model's
    assert not counts_like_provider(size, policy, policy.targets["m"])
    assert hold_prompt_tokens(size, policy, policy.targets["m"]) == size.bound


def test_the_margin_never_lifts_a_hold_above_the_bound() -> None:
    policy = runtime(tokenizer="o200k_base", provider_tokenizer="tiktoken")
    size = counted({"model": "m", "prompt": [101, 2023, 2003, 1037]})  # token ids: bound == count == 4
    assert hold_prompt_tokens(size, policy, policy.targets["m"]) == 4


def test_declaring_tiktoken_needs_the_encoding_named() -> None:
    with pytest.raises(ValidationError, match="needs `tokenizer`"):
        runtime(provider_tokenizer="tiktoken")
    with pytest.raises(ValidationError):
        runtime(provider_tokenizer="llama")
