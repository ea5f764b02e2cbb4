"""Anthropic-style prompt caching for the Messages simulator.

The prompt is a sequence of blocks in prefix order: tools, then system, then each
message's content. A block carrying `cache_control` is a breakpoint; the prefix up to
it is cached (written, billed at the write rate) and later requests with the same
bytes up to that breakpoint read it (billed at the read rate). A prefix shorter than
the model's minimum is never cached, and that is no error. Entries live for their
TTL (5 minutes or 1 hour) from their last use, per scope (model and API key).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.sim.generation import SimRequestError
from gateway.tokens.counting import count_text_tokens

MAX_BREAKPOINTS = 4
TTL_S = {"5m": 300.0, "1h": 3600.0}
MESSAGE_OVERHEAD = 3  # role framing per message, counted on its first block
REPLY_PRIMING = 3  # the assistant turn the model answers in; never cacheable
IMAGE_TOKENS = 85  # a flat count per image: the simulator does not decode them


@dataclass(frozen=True, slots=True)
class PromptBlock:
    tokens: int
    canonical: bytes  # what the cache hashes: the block without its cache_control
    ttl: str | None  # "5m" | "1h" on a breakpoint, else None


@dataclass(frozen=True, slots=True)
class CacheUsage:
    input_tokens: int  # neither read nor written
    cache_read: int
    cache_write_5m: int
    cache_write_1h: int

    @property
    def cache_creation(self) -> int:
        return self.cache_write_5m + self.cache_write_1h


def _text_of(block: Mapping[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "thinking":
        return str(block.get("thinking", ""))
    if kind == "tool_use":
        return str(block.get("name", "")) + orjson.dumps(block.get("input", {})).decode()
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            return "".join(_text_of(b) for b in content if isinstance(b, Mapping))
        return str(content or "")
    return orjson.dumps({k: v for k, v in block.items() if k != "cache_control"}).decode()


def _block_tokens(block: Mapping[str, Any], encoding: str) -> int:
    if block.get("type") == "image":
        return IMAGE_TOKENS
    if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
        images = sum(1 for b in block["content"] if isinstance(b, Mapping) and b.get("type") == "image")
        return images * IMAGE_TOKENS + count_text_tokens(_text_of(block), encoding) + 1
    return count_text_tokens(_text_of(block), encoding) + 1


def _ttl(block: Mapping[str, Any], where: str) -> str | None:
    control = block.get("cache_control")
    if control is None:
        return None
    if not isinstance(control, Mapping) or control.get("type") != "ephemeral":
        raise SimRequestError(f"{where}.cache_control: Input tag must be 'ephemeral'")
    ttl = control.get("ttl", "5m")
    if ttl not in TTL_S:
        raise SimRequestError(f"{where}.cache_control.ttl: Input should be '5m' or '1h'")
    return str(ttl)


def _as_blocks(content: Any, where: str) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list) and all(isinstance(b, Mapping) and isinstance(b.get("type"), str) for b in content):
        return content
    raise SimRequestError(f"{where}: Input should be a valid string or a list of content blocks")


def prompt_blocks(body: Mapping[str, Any], encoding: str) -> list[PromptBlock]:
    """Every block of the prompt in prefix order, with its token count and breakpoint."""
    blocks: list[PromptBlock] = []

    def add(block: Mapping[str, Any], where: str, prefix: bytes = b"", extra: int = 0) -> None:
        canonical = prefix + orjson.dumps({k: v for k, v in block.items() if k != "cache_control"}, option=orjson.OPT_SORT_KEYS)
        blocks.append(PromptBlock(_block_tokens(block, encoding) + extra, canonical, _ttl(block, where)))

    for i, tool in enumerate(body.get("tools") or []):
        add(tool, f"tools.{i}", b"tool:")
    system = body.get("system")
    if system is not None:
        for i, block in enumerate(_as_blocks(system, "system")):
            add(block, f"system.{i}", b"system:")
    for m, message in enumerate(body["messages"]):
        for i, block in enumerate(_as_blocks(message.get("content"), f"messages.{m}.content")):
            add(block, f"messages.{m}.content.{i}", str(message["role"]).encode() + b":", MESSAGE_OVERHEAD if i == 0 else 0)
    automatic = body.get("cache_control")
    if automatic is not None and blocks:
        # A top-level cache_control puts one breakpoint on the last cacheable block.
        ttl = _ttl({"cache_control": automatic}, "cache_control")
        last = blocks[-1]
        blocks[-1] = PromptBlock(last.tokens, last.canonical, last.ttl or ttl)
    breakpoints = sum(1 for b in blocks if b.ttl is not None)
    if breakpoints > MAX_BREAKPOINTS:
        raise SimRequestError(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {breakpoints}.")
    seen_5m = False
    for point in blocks:
        if point.ttl == "5m":
            seen_5m = True
        elif point.ttl == "1h" and seen_5m:
            raise SimRequestError("a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block")
    return blocks


def total_tokens(blocks: Sequence[PromptBlock]) -> int:
    return sum(b.tokens for b in blocks) + REPLY_PRIMING


@dataclass
class AnthropicPromptCache:
    min_tokens: int = 1024
    max_entries: int = 100_000
    clock: Callable[[], float] = time.monotonic
    _entries: OrderedDict[bytes, float] = field(default_factory=OrderedDict)  # key -> expiry

    def clear(self) -> None:
        self._entries.clear()

    def use(self, scope: str, blocks: Sequence[PromptBlock]) -> CacheUsage:
        """Read the longest cached breakpoint prefix, write the later ones; the split of
        this prompt's tokens into uncached, read and written."""
        now = self.clock()
        running = hashlib.sha256(scope.encode())
        points: list[tuple[bytes, int, str]] = []  # (key, prefix tokens, ttl) per breakpoint
        length = 0
        for block in blocks:
            running.update(len(block.canonical).to_bytes(8, "big") + block.canonical)
            length += block.tokens
            if block.ttl is not None and length >= self.min_tokens:
                points.append((running.digest(), length, block.ttl))
        read, hit = 0, -1
        for i, (key, prefix, _) in enumerate(points):
            expiry = self._entries.get(key)
            if expiry is not None and expiry > now:
                read, hit = prefix, i
        written = {"5m": 0, "1h": 0}
        covered = read
        for i, (key, prefix, ttl) in enumerate(points):
            if i <= hit:
                # A hit refreshes the entries it used for another full TTL.
                self._store(key, now + TTL_S[ttl])
                continue
            written[ttl] += prefix - covered
            covered = prefix
            self._store(key, now + TTL_S[ttl])
        total = total_tokens(blocks)
        return CacheUsage(total - read - written["5m"] - written["1h"], read, written["5m"], written["1h"])

    def _store(self, key: bytes, expiry: float) -> None:
        self._entries[key] = max(expiry, self._entries.get(key, 0.0))
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
