"""Prompt token estimates with tiktoken, offline.

tiktoken downloads its BPE files on first use; the pinned litellm wheel ships the
cl100k_base and o200k_base files, so we point TIKTOKEN_CACHE_DIR at them (found via the
installed package's location, without importing litellm). The estimate serves admission
and budgeting only: the provider's reported usage is the billing truth.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import tiktoken

log = logging.getLogger("gateway.tokens")

DEFAULT_ENCODING = "o200k_base"
# Chat framing heuristic (OpenAI cookbook): tokens per message, per name, reply priming.
PER_MESSAGE = 3
PER_NAME = 1
REPLY_PRIMING = 3


def _point_tiktoken_at_bundled_files() -> None:
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return
    bundled = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    if bundled.is_dir():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(bundled)


@lru_cache(maxsize=8)
def get_encoding(name: str = DEFAULT_ENCODING) -> tiktoken.Encoding:
    """The named encoding; one that cannot be loaded here (unknown, or not bundled and
    no network) falls back to o200k_base - an estimate is still better than none."""
    _point_tiktoken_at_bundled_files()
    try:
        return tiktoken.get_encoding(name)
    except Exception:
        if name == DEFAULT_ENCODING:
            raise
        log.warning("tokenizer %s is not available; estimating with %s", name, DEFAULT_ENCODING)
        return tiktoken.get_encoding(DEFAULT_ENCODING)


@lru_cache(maxsize=256)
def encoding_name_for_model(model: str, fallback: str = DEFAULT_ENCODING) -> str:
    try:
        return tiktoken.encoding_name_for_model(model)
    except KeyError:
        return fallback


def count_text_tokens(text: str, encoding: str = DEFAULT_ENCODING) -> int:
    return len(get_encoding(encoding).encode_ordinary(text))


def _content_text(content: Any) -> Iterable[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield part["text"]


def count_chat_tokens(messages: Any, encoding: str = DEFAULT_ENCODING) -> int:
    """Estimate the prompt tokens of a chat request's `messages` list."""
    enc = get_encoding(encoding)
    total = REPLY_PRIMING
    if not isinstance(messages, list):
        return total
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        total += PER_MESSAGE
        for text in _content_text(message.get("content")):
            total += len(enc.encode_ordinary(text))
        if isinstance(message.get("name"), str):
            total += PER_NAME + len(enc.encode_ordinary(message["name"]))
        for call in message.get("tool_calls") or ():
            if isinstance(call, Mapping):
                fn = call.get("function") or {}
                total += len(enc.encode_ordinary(str(fn.get("name", "")) + str(fn.get("arguments", ""))))
    return total
