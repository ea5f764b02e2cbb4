"""Token-bucket specs and what admission took for a request (admission/ makes them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BucketSpec:
    key: str  # e.g. "tenant:acme:rpm"; the Redis store adds its own prefix and hash tag
    capacity: float  # burst size = the per-minute limit
    refill_per_s: float  # limit / 60
    scope: str  # e.g. "tenant:acme": buckets of one scope live in one Redis slot

    def __post_init__(self) -> None:
        # Checked here so a bad limit fails at config resolution, not inside a Lua script.
        for name, value in (("capacity", self.capacity), ("refill_per_s", self.refill_per_s)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"bucket {self.key}: {name} must be finite and >= 0, got {value}")


@dataclass(slots=True)
class Admitted:
    """What admission took for one request, so settlement can correct it."""

    tokens: float = 0.0
    token_specs: list[BucketSpec] = field(default_factory=list)
