"""Hostile JSON for fuzzing request bodies, from a seeded generator (the same seed gives
the same bodies, so a failure can be replayed): wrong types, huge and negative numbers,
NaN-like strings, deep nesting, unicode, nulls, empty and very long strings.

Values are JSON text, not Python objects, so that they can say what a client may send
and Python's encoders would not: nesting 300 or 1,000 levels deep, numbers past a
double's range, NaN literals."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STRINGS = ["", " ", "NaN", "nan", "Infinity", "-Infinity", "inf", "1e999", "-1", "0", "1.5", "null", "true", "false",
           "０１２", "٣", "\u202e\u0000", "\x00", "\ud7ff\ue000", "💸" * 3, "a\r\nx-injected: 1", "../../etc/passwd",
           "{}", "[]", "2026-13-45", "2026-02-30", "9999-12-31", "0001-01-01", "sha256:" + "0" * 64, "%s%n", "'; DROP TABLE tasks;--"]
NUMBERS = ["0", "-0", "1", "-1", "0.5", "-0.5", "1e308", "-1e308", "1e-320", "1e400", "-1e400", "9223372036854775807",
           "9223372036854775808", "18446744073709551616", "123456789012345678901234567890", "-99999999999999999999",
           "3.141592653589793238462643383279", "1E+2", "4294967296", "NaN", "Infinity"]


@dataclass(frozen=True, slots=True)
class Json:
    """A JSON text, kept as written."""

    text: str


def dump(value: Any) -> str:
    """JSON text for `value`, which may hold `Json` pieces anywhere."""
    if isinstance(value, Json):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


class Hostile:
    """Hostile values and mutations of valid bodies, from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def value(self, depth: int = 0) -> Any:
        kinds: list[Callable[[], Any]] = [
            lambda: None, lambda: self.rng.choice([True, False]), self.number, self.string, self.string,
            self.long_string, self.deep,
        ]
        if depth < 3:
            kinds += [lambda: self.list(depth), lambda: self.object(depth)]
        return self.rng.choice(kinds)()

    def number(self) -> Json:
        return Json(self.rng.choice([*NUMBERS, str(self.rng.randint(-10**6, 10**6)), repr(self.rng.uniform(-1e6, 1e6))]))

    def string(self) -> str:
        return self.rng.choice(STRINGS)

    def long_string(self) -> str:
        return self.rng.choice(["x", "é", "字", "\u200b"]) * self.rng.choice([1000, 10_000, 20_000])

    def deep(self) -> Json:
        levels = self.rng.choice([64, 128, 200, 239, 240, 241, 254, 255, 256, 300, 1000, 1100])
        opener, closer = self.rng.choice([("[", "]"), ('{"a":', "}")])
        return Json(opener * levels + "1" + closer * levels)

    def list(self, depth: int) -> list[Any]:
        return [self.value(depth + 1) for _ in range(self.rng.randint(0, 4))]

    def object(self, depth: int) -> dict[str, Any]:
        return {self.rng.choice(["a", "", "role", "type", "content", "é", "0"]): self.value(depth + 1)
                for _ in range(self.rng.randint(0, 4))}

    def mutate(self, body: dict[str, Any], fields: list[str]) -> Any:
        """`body` with one to three fields (dotted paths into it, or new names) made
        hostile or removed; now and then a hostile value in place of the whole body."""
        if self.rng.random() < 0.04:
            return self.value()
        out = json.loads(json.dumps(body))
        for _ in range(self.rng.randint(1, 3)):
            path = self.rng.choice([*fields, "unexpected_field"]).split(".")
            parent: Any = out
            for part in path[:-1]:
                step: str | int = int(part) if isinstance(parent, list) and part.isdigit() else part
                parent = parent[step] if isinstance(parent, dict | list) and _has(parent, step) else None
            if isinstance(parent, dict):
                if self.rng.random() < 0.1:
                    parent.pop(path[-1], None)
                else:
                    parent[path[-1]] = self.value()
            elif isinstance(parent, list) and parent and path[-1].isdigit():
                parent[int(path[-1]) % len(parent)] = self.value()
        return out


def _has(container: dict[str, Any] | list[Any], step: str | int) -> bool:
    if isinstance(container, dict):
        return step in container
    return isinstance(step, int) and 0 <= step < len(container)
