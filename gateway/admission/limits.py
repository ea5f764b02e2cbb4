"""Configured RPM/TPM limits turned into bucket specs, and admission results turned
into the response headers OpenAI's clients read (`x-ratelimit-*`, `retry-after`)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from gateway.admission.buckets import TakeResult
from gateway.types.limits import BucketSpec
from gateway.upstreams.ratelimit_headers import format_go_duration

RPM = "rpm"
TPM = "tpm"


def tenant_specs(tenant: str, rpm: int | None, tpm: int | None) -> list[BucketSpec]:
    return _specs(f"tenant:{tenant}", rpm, tpm)


def model_specs(model: str, rpm: int | None, tpm: int | None) -> list[BucketSpec]:
    """Limits on a model across all tenants (one scope per model)."""
    return _specs(f"model:{model}", rpm, tpm)


def upstream_specs(upstream: str, rpm: int | None, tpm: int | None) -> list[BucketSpec]:
    """Our share of a provider account's limits, so we pace ourselves instead of collecting 429s."""
    return _specs(f"upstream:{upstream}", rpm, tpm)


def _specs(scope: str, rpm: int | None, tpm: int | None) -> list[BucketSpec]:
    """[rpm, tpm] specs for the limits that are set; a limit of 0 admits nothing."""
    specs = []
    for kind, limit in ((RPM, rpm), (TPM, tpm)):
        if limit is None:
            continue
        if limit < 0:
            raise ValueError(f"{scope}: {kind} must be >= 0, got {limit}")
        specs.append(BucketSpec(key=f"{scope}:{kind}", capacity=float(limit), refill_per_s=limit / 60.0, scope=scope))
    return specs


def spec_kind(spec: BucketSpec) -> str:
    """The limit a spec made here enforces: RPM or TPM."""
    kind = spec.key.rsplit(":", 1)[-1]
    if kind not in (RPM, TPM):
        raise ValueError(f"not a limits spec: {spec.key}")
    return kind


def request_takes(specs: Iterable[BucketSpec], tokens: float) -> list[tuple[BucketSpec, float]]:
    """What one request takes: 1 from each rpm bucket, `tokens` (prompt estimate +
    output bound) from each tpm bucket."""
    return [(spec, 1.0 if spec_kind(spec) == RPM else float(tokens)) for spec in specs]


def ratelimit_headers(result: TakeResult, rpm_spec: BucketSpec | None, tpm_spec: BucketSpec | None) -> dict[str, str]:
    """OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` for the given buckets.

    A bucket the take did not include gets no headers; a bucket in debt shows 0 remaining.
    """
    headers: dict[str, str] = {}
    for spec, noun in ((rpm_spec, "requests"), (tpm_spec, "tokens")):
        if spec is None or spec.key not in result.remaining:
            continue
        headers[f"x-ratelimit-limit-{noun}"] = str(math.floor(spec.capacity))
        headers[f"x-ratelimit-remaining-{noun}"] = str(max(0, math.floor(result.remaining[spec.key])))
        reset = result.reset_s.get(spec.key)
        if reset is not None and math.isfinite(reset):
            headers[f"x-ratelimit-reset-{noun}"] = format_go_duration(reset)
    return headers


def retry_after_header(wait_s: float) -> dict[str, str]:
    """`retry-after` in whole seconds (rounded up, at least 1) and the exact `retry-after-ms`.

    Empty when the wait is infinite: no retry time would be honest.
    """
    if not math.isfinite(wait_s):
        return {}
    # The 1e-6 slack keeps float noise (2.0000000001 s) from adding a whole second.
    ms = max(1, math.ceil(wait_s * 1000 - 1e-6))
    return {"retry-after": str(max(1, math.ceil(ms / 1000))), "retry-after-ms": str(ms)}
