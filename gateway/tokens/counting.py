"""Prompt token counts with tiktoken, offline.

tiktoken downloads its BPE files on first use; the pinned litellm wheel ships the
cl100k_base and o200k_base files, so we point TIKTOKEN_CACHE_DIR at them (found via the
installed package's location, without importing litellm). Counts serve admission,
routing and budgeting only: the provider's reported usage is the billing truth, and a
budget hold uses a count only where the provider counts with the same encoding
(tokens/prompt_bound.py bounds the rest). Counting a 1k-token prompt costs ~0.3 ms
of CPU and loading an encoding ~0.5 s and ~50 MB, which is why the gateway only counts
when a decision needs the exact figure (see tokens/prompt_size.py).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import tiktoken

log = logging.getLogger("gateway.tokens")

DEFAULT_ENCODING = "o200k_base"
# Chat framing heuristic (OpenAI cookbook): tokens per message, per name, reply priming.
PER_MESSAGE = 3
PER_NAME = 1
REPLY_PRIMING = 3


class Encoder(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


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


def load_encoder(name: str) -> Encoder:
    """An encoder that only encodes: tiktoken's `Encoding` also keeps its rank table as
    a Python dict (~30 MB for o200k_base) for decoding helpers the gateway never calls.
    Same BPE core and same counts as `get_encoding(name)` (tests/unit/tokens/test_counting.py)."""
    _point_tiktoken_at_bundled_files()
    # tiktoken is pinned; the test named above guards this seam against its internals moving.
    from tiktoken._tiktoken import CoreBPE  # type: ignore[import-not-found]
    from tiktoken_ext.openai_public import ENCODING_CONSTRUCTORS  # type: ignore[import-untyped]

    constructor = ENCODING_CONSTRUCTORS.get(name)
    if constructor is None:
        return get_encoding(name)
    try:
        params = constructor()
    except Exception:
        return get_encoding(name)  # not bundled here: the same fallback (and warning) as above
    core: Encoder = CoreBPE(params["mergeable_ranks"], params["special_tokens"], params["pat_str"])
    return core


@lru_cache(maxsize=256)
def encoding_name_for_model(model: str, fallback: str = DEFAULT_ENCODING) -> str:
    try:
        return tiktoken.encoding_name_for_model(model)
    except KeyError:
        return fallback


def _encoder(encoding: str | Encoder) -> Encoder:
    return get_encoding(encoding) if isinstance(encoding, str) else encoding


def count_text_tokens(text: str, encoding: str | Encoder = DEFAULT_ENCODING) -> int:
    return len(_encoder(encoding).encode_ordinary(text))


def _content_text(content: Any) -> Iterable[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield part["text"]


def _chat_texts(messages: Any) -> Iterable[tuple[int, str]]:
    """(framing tokens, text) for everything `count_chat_tokens` counts."""
    yield REPLY_PRIMING, ""
    if not isinstance(messages, list):
        return
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        yield PER_MESSAGE, ""
        for text in _content_text(message.get("content")):
            yield 0, text
        if isinstance(message.get("name"), str):
            yield PER_NAME, message["name"]
        for call in message.get("tool_calls") or ():
            if isinstance(call, Mapping):
                fn = call.get("function") or {}
                yield 0, str(fn.get("name", "")) + str(fn.get("arguments", ""))


def count_chat_tokens(messages: Any, encoding: str | Encoder = DEFAULT_ENCODING) -> int:
    """Estimate the prompt tokens of a chat request's `messages` list."""
    enc = _encoder(encoding)
    return sum(framing + (len(enc.encode_ordinary(text)) if text else 0) for framing, text in _chat_texts(messages))


class Tokenizers:
    """The encoders this process has loaded, each loaded once, off the event loop."""

    def __init__(self) -> None:
        self._loaded: dict[str, Encoder] = {}
        self._lock = threading.Lock()

    def loaded(self, name: str) -> Encoder | None:
        return self._loaded.get(name)

    def load(self, name: str) -> Encoder:
        with self._lock:  # two requests wanting a new encoding at once load it once
            encoder = self._loaded.get(name)
            if encoder is None:
                encoder = self._loaded[name] = load_encoder(name)
            return encoder

    async def get(self, name: str) -> Encoder:
        encoder = self._loaded.get(name)
        if encoder is None:
            encoder = await asyncio.get_running_loop().run_in_executor(None, self.load, name)
        return encoder

    def _load_all(self, names: list[str]) -> None:
        for name in names:
            self.load(name)

    def preload(self, names: Iterable[str]) -> threading.Thread:
        """Load in the background, so start-up does not wait for encodings."""
        thread = threading.Thread(target=self._load_all, args=(sorted(set(names)),), name="tokenizers", daemon=True)
        thread.start()
        return thread
