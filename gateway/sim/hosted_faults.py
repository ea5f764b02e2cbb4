"""Injected provider failures for the hosted simulator, and OpenAI's error bodies.

Faults are drawn from (seed, request counter), so a test that sends the same
sequence of requests against the same seed sees the same failures.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from gateway.sim.textgen import seeded_rng


class Fault(enum.Enum):
    RATE_LIMITED = "429"
    SERVER_ERROR = "5xx"
    MALFORMED = "malformed"
    CUT_STREAM = "cut_stream"


@dataclass(frozen=True)
class FaultRates:
    seed: int
    fail_429_rate: float
    fail_5xx_rate: float
    malformed_rate: float
    cut_stream_rate: float

    @property
    def any(self) -> bool:
        return (self.fail_429_rate + self.fail_5xx_rate + self.malformed_rate + self.cut_stream_rate) > 0


def draw_fault(rates: FaultRates, counter: int, stream: bool) -> tuple[Fault | None, int]:
    """The fault for request number `counter` (if any) and, for server errors, the status."""
    if not rates.any:
        return None, 0
    rng = seeded_rng("fault", rates.seed, counter)
    # Always draw all four so one rate's value does not shift the others' sequence.
    draws = [rng.random() for _ in range(4)]
    status = 503 if rng.random() < 0.5 else 500
    if draws[0] < rates.fail_429_rate:
        return Fault.RATE_LIMITED, 429
    if draws[1] < rates.fail_5xx_rate:
        return Fault.SERVER_ERROR, status
    if draws[2] < rates.malformed_rate:
        return Fault.MALFORMED, 200
    if stream and draws[3] < rates.cut_stream_rate:
        return Fault.CUT_STREAM, 200
    return None, 0


def openai_error(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def server_error_body(status: int, message: str | None = None) -> dict[str, Any]:
    if message is not None:
        return openai_error(message, "server_error")
    if status == 503:
        return openai_error("The engine is currently overloaded, please try again later.", "server_error")
    return openai_error(
        "The server had an error while processing your request. Sorry about that!", "server_error"
    )


def injected_rate_limit_body(model: str) -> dict[str, Any]:
    return openai_error(
        f"Rate limit reached for {model} in organization org-sim on requests per min (RPM). "
        "Please try again later.",
        "requests",
        None,
        "rate_limit_exceeded",
    )


# What a proxy or provider sometimes returns under load: 200 with a body cut short.
MALFORMED_JSON_BODY = b'{"id": "chatcmpl-7f3a", "object": "chat.completion", "choi'
MALFORMED_SSE_BODY = b'data: {"id": "chatcmpl-7f3a", "object": "chat.completion.ch\n\ndata: [DONE]\n\n'
