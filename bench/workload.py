"""The request the benchmarks send: a deterministic ~1k-token chat prompt, `bench-model`."""

from __future__ import annotations

import random
from typing import Any

import orjson

MODEL = "bench-model"
MAX_TOKENS = 20
PROMPT_WORDS = 925  # with sentence capitals and periods: ~1,000 o200k tokens (~1,030 with the framing)
# Common English words, each a single token in cl100k_base and o200k_base.
_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have "
    "an had they you were their one all we can her has there been if more when will would who so no time "
    "about many then them these may some into only its other could over new also after first two any use "
    "people most made such through where much before way right back years good well water long little very "
    "work still world just day great place under last never same another while both house found part around"
)
WORDS = tuple(_WORD_TEXT.split())


def prompt_text(words: int = PROMPT_WORDS, seed: int = 1234) -> str:
    """Seeded, so every run (and both targets) send byte-identical prompts."""
    rng = random.Random(seed)
    sentences: list[str] = []
    remaining = words
    while remaining > 0:
        n = min(remaining, rng.randint(8, 16))
        sentence = " ".join(rng.choice(WORDS) for _ in range(n))
        sentences.append(sentence[0].upper() + sentence[1:] + ".")
        remaining -= n
    return " ".join(sentences)


def chat_body(stream: bool, words: int = PROMPT_WORDS) -> bytes:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Summarize this text in one line.\n\n" + prompt_text(words)},
        ],
        "max_tokens": MAX_TOKENS,
        "stream": stream,
    }
    return orjson.dumps(body)


def responses_body(stream: bool, words: int = PROMPT_WORDS) -> bytes:
    """The same request as `chat_body`, asked of the Responses API (stored, its default)."""
    return orjson.dumps({"model": MODEL, "instructions": "You are a terse assistant.",
                         "input": "Summarize this text in one line.\n\n" + prompt_text(words),
                         "max_output_tokens": MAX_TOKENS, "stream": stream})


def messages_body(stream: bool, model: str, words: int = PROMPT_WORDS) -> bytes:
    """The same request as `chat_body`, asked of Anthropic's Messages API."""
    return orjson.dumps({"model": model, "system": "You are a terse assistant.", "max_tokens": MAX_TOKENS, "stream": stream,
                         "messages": [{"role": "user", "content": "Summarize this text in one line.\n\n" + prompt_text(words)}]})


def prompt_tokens() -> int:
    """The gateway's own estimate of the prompt (o200k_base plus chat framing)."""
    from gateway.tokens.counting import count_chat_tokens

    return count_chat_tokens(orjson.loads(chat_body(False))["messages"], "o200k_base")
