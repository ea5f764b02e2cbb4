"""RequestContext: everything one client request accumulates on its way through the
stages. Stages read and write it; nothing else carries per-request state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.routing.resolved import ModelTarget, RuntimePolicy
from gateway.telemetry.timeline import Timeline
from gateway.tokens.prompt_size import PromptSize
from gateway.types.budget import BudgetClaim, Hold
from gateway.types.cache import CachedAnswer, CachePlan
from gateway.types.limits import Admitted
from gateway.types.usage import Usage


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
    cost_pico: int = 0  # what the ledger books for this attempt, once priced (accounting/hold_and_settle.py)
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
    status: int = 200
    response_headers: dict[str, str] = field(default_factory=dict)
    upstream_headers: dict[str, str] = field(default_factory=dict)  # the client's, passed on (anthropic-version)

    @property
    def final_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None
