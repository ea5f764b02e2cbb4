"""RequestContext: everything one client request accumulates on its way through the
stages. Stages read and write it; nothing else carries per-request state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.accounting.ledger import BudgetClaim, Hold
from gateway.admission.limits import Admitted
from gateway.caching.response_cache import CachedAnswer, CachePlan
from gateway.pipeline.prompt_size import PromptSize
from gateway.routing.resolved import ModelTarget, RuntimePolicy
from gateway.telemetry.timeline import Timeline


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0

    def as_openai(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": self.cache_write_tokens},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
        }

    @classmethod
    def from_openai(cls, usage: dict[str, Any]) -> Usage:
        prompt = usage.get("prompt_tokens_details") or {}
        completion = usage.get("completion_tokens_details") or {}
        return cls(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            cached_tokens=int(prompt.get("cached_tokens") or 0),
            cache_write_tokens=int(prompt.get("cache_write_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            reasoning_tokens=int(completion.get("reasoning_tokens") or 0),
        )


@dataclass(slots=True)
class Attempt:
    """One upstream attempt; every one is booked, whatever its outcome."""

    target: ModelTarget
    timeline: Timeline
    status: str = "pending"  # ok | error | timeout | cancelled | cut | pending
    http_status: int | None = None
    replica: str | None = None
    provider_request_id: str | None = None
    usage: Usage | None = None  # as the provider reported it
    estimated: Usage | None = None  # the gateway's estimate, when the provider never reported usage
    relayed_output: str = ""  # the generated text relayed to the client, kept for that estimate
    cost_pico: int = 0  # what the ledger books for this attempt, once priced (accounting/books.py)
    error: str | None = None
    limit_headers: dict[str, str] | None = None  # the provider's rate-limit headers on this reply
    checks: str | None = None  # the route's verdict on this answer: "passed" or "failed: ..."
    escalation: str | None = None  # why the route moved on from this answer


@dataclass(slots=True)
class RequestContext:
    request_id: str
    endpoint: str  # chat.completions | completions | embeddings | messages | messages.count_tokens
    path: str  # upstream path, e.g. /chat/completions
    policy: RuntimePolicy  # the policy this request started with
    timeline: Timeline = field(default_factory=Timeline)
    tenant: str = ""
    key_id: str = ""
    task_id: str | None = None
    task_class: str | None = None
    deadline: float = 0.0  # monotonic seconds
    body: dict[str, Any] = field(default_factory=dict)
    requested_model: str = ""
    stream: bool = False
    buffered: bool = False  # a streamed request answered upstream in one piece, checked, then replayed
    client_wants_usage: bool = False
    prompt: PromptSize = field(default_factory=PromptSize.empty)
    max_output_tokens: int = 0
    route: str | None = None
    targets: list[ModelTarget] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    cache: CachePlan | None = None
    cache_answer: CachedAnswer | None = None  # served instead of an upstream call
    admitted: Admitted | None = None  # what admission took, corrected at settle
    claims: list[BudgetClaim] = field(default_factory=list)  # budgets this request draws on
    holds: list[Hold] = field(default_factory=list)
    cost_pico: int = 0
    finished: bool = False
    status: int = 200
    response_headers: dict[str, str] = field(default_factory=dict)
    upstream_headers: dict[str, str] = field(default_factory=dict)  # the client's, passed on (anthropic-version)

    @property
    def final_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None
