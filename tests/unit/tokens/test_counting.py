"""The light encoder counts exactly like tiktoken's own, and the prompt's bound is never
below the count - for English, other scripts, emoji and code alike."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from gateway.tokens.counting import (
    Tokenizers,
    count_chat_tokens,
    count_text_tokens,
    get_encoding,
    load_encoder,
)
from gateway.tokens.prompt_bound import prompt_tokens_bound

SAMPLES = [
    "Summarize this text in one line.",
    "Grüße aus Köln – naïve café, façade, coöperate.",
    "東京は日本の首都です。人口は約1400万人。",
    "Привет, как дела? Всё хорошо.",
    "emoji 🤖🚀👩‍👩‍👧‍👦 and flags 🇯🇵🇧🇷",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\t\ttabs",
    "   leading and trailing spaces   \n\n\n",
    "a" * 5000,
    "1234567890" * 30,
]


def _random_text(rng: random.Random) -> str:
    alphabet = ["a", "b", " ", "\n", "é", "ß", "中", "文", "🙂", "1", "!", "'s", "\t", "\u200d"]
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400)))


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_light_encoder_counts_exactly_like_tiktoken(encoding: str) -> None:
    light, full = load_encoder(encoding), get_encoding(encoding)
    rng = random.Random(7)
    for text in SAMPLES + [_random_text(rng) for _ in range(200)]:
        assert light.encode_ordinary(text) == full.encode_ordinary(text)


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_the_bound_is_never_below_the_count(encoding: str) -> None:
    rng = random.Random(11)
    texts = SAMPLES + [_random_text(rng) for _ in range(300)]
    for text in texts:
        assert prompt_tokens_bound("completions", {"prompt": text}) >= count_text_tokens(text, encoding)
    messages = [{"role": "system", "content": texts[0], "name": "planner"},
                {"role": "user", "content": [{"type": "text", "text": t} for t in texts[1:6]]},
                {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "lookup", "arguments": texts[6]}}]}]
    assert prompt_tokens_bound("chat.completions", {"messages": messages}) >= count_chat_tokens(messages, encoding)
    assert prompt_tokens_bound("chat.completions", {"messages": []}) >= count_chat_tokens([], encoding)  # framing only


def test_a_lone_surrogate_does_not_break_the_bound() -> None:
    # A valid JSON escape that orjson refuses but Python's json module lets through.
    assert prompt_tokens_bound("completions", {"prompt": "\ud800"}) >= 3


def test_an_encoding_is_loaded_once_however_many_ask_at_once() -> None:
    tokenizers = Tokenizers()
    assert tokenizers.loaded("cl100k_base") is None

    async def ask() -> list[object]:
        return list(await asyncio.gather(*(tokenizers.get("cl100k_base") for _ in range(8))))

    encoders = asyncio.run(ask())
    assert all(e is encoders[0] for e in encoders)
    assert tokenizers.loaded("cl100k_base") is encoders[0]


def test_preload_runs_in_the_background() -> None:
    tokenizers = Tokenizers()
    thread = tokenizers.preload(["o200k_base"])
    assert isinstance(thread, threading.Thread)
    thread.join(60)
    encoder = tokenizers.loaded("o200k_base")
    assert encoder is not None and len(encoder.encode_ordinary("hello world")) == 2
