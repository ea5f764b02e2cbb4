"""Deterministic pseudo-text: seeded word streams and embedding vectors.

Every word is one token (with its leading space) in both o200k_base and cl100k_base, so
one generated word is exactly one completion token and a client re-counting the text
with tiktoken gets the same number the simulator reports.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

WORDS: tuple[str, ...] = tuple(
    " " + w
    for w in ["alpha", "beta", "gamma", "delta", "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like", "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no", "way", "could", "people", "my", "than", "first", "water", "been", "call", "who", "oil", "its", "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part", "river", "stone", "light", "cloud", "green", "blue", "red", "north", "south", "east", "west"]
)


def stable_digest(*parts: object) -> bytes:
    """sha256 over a canonical JSON rendering, so equal requests give equal digests."""
    return hashlib.sha256(orjson.dumps(list(parts), option=orjson.OPT_SORT_KEYS, default=str)).digest()


def seeded_rng(*parts: object) -> random.Random:
    return random.Random(int.from_bytes(stable_digest(*parts)[:16], "big"))


@dataclass(frozen=True)
class WordStream:
    """The words of one completion and why it ended."""

    pieces: list[str]
    finish_reason: str  # "stop" | "length"

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def generate_words(rng: random.Random, count: int, finish_reason: str, stop: Sequence[str] = ()) -> WordStream:
    """Draw `count` words; a stop sequence ends the text early with finish_reason "stop".

    Like a real model, the word that completes the stop sequence is still generated
    (and billed), but the stop text and anything after it never reach the client.
    """
    words = rng.choices(WORDS, k=count)
    if not stop:
        return WordStream(words, finish_reason)
    text = ""
    for i, word in enumerate(words):
        text += word
        hit = min((pos for s in stop if (pos := text.find(s)) >= 0), default=-1)
        if hit >= 0:
            return WordStream(_cut_pieces(words[: i + 1], hit), "stop")
    return WordStream(words, finish_reason)


def _cut_pieces(words: list[str], keep_chars: int) -> list[str]:
    """Keep one piece per generated token, trimming the text to `keep_chars` characters."""
    pieces: list[str] = []
    used = 0
    for word in words:
        room = max(keep_chars - used, 0)
        pieces.append(word[:room])
        used += len(word)
    return pieces


def embedding_vector(item: object, dims: int, seed: int) -> list[float]:
    """A unit vector determined by the input text (or token array) and the seed."""
    rng = seeded_rng("embedding", seed, item)
    raw = [rng.gauss(0.0, 1.0) for _ in range(dims)]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


def encode_base64_floats(vector: Sequence[float]) -> str:
    """The openai SDK asks for base64 by default: little-endian float32, base64."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
