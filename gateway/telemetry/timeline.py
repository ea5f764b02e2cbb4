"""Per-request timeline: monotonic marks for the phases a user and finance care about."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Timeline:
    """Seconds on the monotonic clock; `wall_start` anchors them to real time."""

    wall_start: float = field(default_factory=time.time)
    enqueue: float = field(default_factory=time.monotonic)
    upstream_start: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    end: float | None = None

    def mark(self, name: str) -> float:
        now = time.monotonic()
        setattr(self, name, now)
        return now

    def as_offsets_ms(self, base: float | None = None) -> dict[str, float | None]:
        """Milliseconds since `base` (default: this timeline's enqueue), for the books."""
        base = self.enqueue if base is None else base

        def off(t: float | None) -> float | None:
            return None if t is None else round((t - base) * 1000, 3)

        return {
            "enqueue": off(self.enqueue),
            "upstream_start": off(self.upstream_start),
            "first_token": off(self.first_token),
            "last_token": off(self.last_token),
            "end": off(self.end),
        }
