"""Escalation along a route's chain: answer with the cheapest model, check the answer
with the route's verifiable signals, and move up the chain only when a check fails -
never on a model's own claim. Every attempt is billed to the same request and task;
when the budget cannot afford the next model, the best answer so far is returned."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import BudgetExceeded, GatewayError
from gateway.request_context import RequestContext
from gateway.routing.policy import ClientSignalRule, EscalationSignal, MissingFields, Route
from gateway.routing.resolved import ModelTarget
from gateway.verify.signals import Check, Failure, Verifier

HIGH_RISK = "high"


def checks_for(route: Route) -> list[Check]:
    checks = []
    for signal in route.escalate_when:
        checks.append(_check(signal))
    return checks


def _check(signal: EscalationSignal) -> Check:
    if isinstance(signal, MissingFields):
        return Check("missing_fields", fields=tuple(signal.missing_fields))
    if isinstance(signal, ClientSignalRule):
        rule = signal.client_signal
        return Check("client_signal", header=rule.header.lower(), below=rule.below, equals=rule.equals)
    return Check(signal)


def describe(failures: list[Failure]) -> str:
    return ", ".join(dict.fromkeys(f.signal for f in failures))


@dataclass(slots=True)
class Escalated:
    body: dict[str, Any]
    raw: bytes
    target: ModelTarget
    reasons: list[str] = field(default_factory=list)  # one entry per escalation
    stopped: str | None = None  # "budget" when the next model could not be afforded
    passed: bool = True


async def run_chain(
    ctx: RequestContext,
    chain: list[ModelTarget],
    checks: list[Check],
    verifier: Verifier,
    headers: Mapping[str, str],
    attempt_on: Callable[[ModelTarget], Awaitable[tuple[dict[str, Any], bytes]]],
) -> Escalated:
    # A client that knows the task is risky goes straight to the strongest model.
    start = len(chain) - 1 if headers.get("x-task-risk", "").lower() == HIGH_RISK else 0
    best: Escalated | None = None
    for position in range(start, len(chain)):
        target = chain[position]
        try:
            body, raw = await attempt_on(target)
        except GatewayError as exc:
            if best is None:
                raise
            # Keep the answer we have: the next model could not be afforded, or failed.
            best.stopped = "budget" if isinstance(exc, BudgetExceeded) else "upstream_error"
            return best
        failures = verifier.check(checks, ctx.body, body, headers) if checks else []
        attempt = ctx.final_attempt
        verdict = "passed" if not failures else f"failed: {describe(failures)}"
        if attempt is not None:
            attempt.checks = verdict if checks else None
        reasons = best.reasons if best is not None else []
        best = Escalated(body, raw, target, reasons, passed=not failures)
        if not failures:
            return best
        if position + 1 < len(chain):
            best.reasons.append(describe(failures))
            if attempt is not None:
                attempt.escalation = f"{describe(failures)} -> {chain[position + 1].name}"
    assert best is not None
    return best
