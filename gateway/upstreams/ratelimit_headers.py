"""Providers' rate-limit headers, read into one shape (`ProviderLimits`), and the Go
duration grammar OpenAI uses for its reset headers (parsed here, formatted for ours).

OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go
durations (`1s`, `6m0s`, `12ms`). Anthropic: `anthropic-ratelimit-{requests,tokens,
input-tokens,output-tokens}-{limit,remaining,reset}`, resets as RFC 3339 timestamps.
Both: `retry-after` (seconds or an HTTP date) and `retry-after-ms`. Headers are
untrusted input: anything unparsable is ignored, nothing here raises on bad values.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime


@dataclass(frozen=True, slots=True)
class ProviderLimits:
    requests_remaining: int | None = None
    requests_limit: int | None = None
    requests_reset_s: float | None = None  # seconds from now until the request limit is full again
    tokens_remaining: int | None = None
    tokens_limit: int | None = None
    tokens_reset_s: float | None = None
    # From retry-after-ms when it parses (more precise), else retry-after.
    retry_after_s: float | None = None


def parse_provider_limits(headers: Mapping[str, str], now: float | None = None) -> ProviderLimits:
    """Read whatever limits `headers` carry; `now` (epoch seconds) turns dates into delays."""
    h = {str(k).lower(): str(v).strip() for k, v in headers.items()}
    now = time.time() if now is None else now
    anthropic_tokens = _anthropic_tokens_family(h)
    return ProviderLimits(
        requests_remaining=_first_count(h, "x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining"),
        requests_limit=_first_count(h, "x-ratelimit-limit-requests", "anthropic-ratelimit-requests-limit"),
        requests_reset_s=_first_reset(h, now, "x-ratelimit-reset-requests", "anthropic-ratelimit-requests-reset"),
        tokens_remaining=_first_count(h, "x-ratelimit-remaining-tokens", f"{anthropic_tokens}-remaining"),
        tokens_limit=_first_count(h, "x-ratelimit-limit-tokens", f"{anthropic_tokens}-limit"),
        tokens_reset_s=_first_reset(h, now, "x-ratelimit-reset-tokens", f"{anthropic_tokens}-reset"),
        retry_after_s=_retry_after(h, now),
    )


def may_be_exhausted(headers: Mapping[str, str]) -> bool:
    """False when every `remaining` count the headers carry has room left: then they
    cannot pause anyone (`UpstreamHealth.learn`), and the full parse - on every
    successful reply of a provider that sends them - is skipped. Anything that does not
    read as a positive number says True, so the full parse decides."""
    for name, value in headers.items():
        if "remaining" in name.lower():
            try:
                if not float(value) > 0:
                    return True
            except ValueError:
                return True
    return False


def _anthropic_tokens_family(h: Mapping[str, str]) -> str:
    """The combined `tokens` limit when sent; else the input or output limit with fewer left."""
    if any(f"anthropic-ratelimit-tokens-{part}" in h for part in ("limit", "remaining", "reset")):
        return "anthropic-ratelimit-tokens"
    split = [f"anthropic-ratelimit-{kind}" for kind in ("input-tokens", "output-tokens")]
    known = [(_count(h.get(f"{family}-remaining")), family) for family in split]
    with_remaining = [(left, family) for left, family in known if left is not None]
    return min(with_remaining)[1] if with_remaining else split[0]


def _first_count(h: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = _count(h.get(name))
        if value is not None:
            return value
    return None


def _first_reset(h: Mapping[str, str], now: float, *names: str) -> float | None:
    for name in names:
        value = h.get(name)
        seconds = None if value is None else parse_reset(value, now)
        if seconds is not None:
            return seconds
    return None


def _count(value: str | None) -> int | None:
    number = _non_negative(value)
    return None if number is None else int(number)


def _non_negative(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _retry_after(h: Mapping[str, str], now: float) -> float | None:
    ms = _non_negative(h.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000.0
    value = h.get("retry-after")
    if value is None:
        return None
    seconds = _non_negative(value)
    return seconds if seconds is not None else _http_date_delay(value, now)


def _http_date_delay(value: str, now: float) -> float | None:
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return _delay_until(when, now)


def parse_reset(value: str, now: float) -> float | None:
    """Seconds until a reset given as a Go duration, plain seconds, epoch seconds or RFC 3339."""
    duration = parse_go_duration(value)
    if duration is not None:
        return duration
    number = _non_negative(value)
    if number is not None:
        # Some providers send an epoch timestamp here; no sane reset delay is 30+ years.
        return max(0.0, number - now) if number >= 1e9 else number
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return _delay_until(when, now)


def _delay_until(when: datetime, now: float) -> float | None:
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # RFC 3339 and HTTP dates are UTC when unmarked
    try:
        return max(0.0, when.timestamp() - now)
    except (OverflowError, OSError, ValueError):
        return None


# --- Go's time.Duration grammar (the unsigned part OpenAI's reset headers use) ---

_GO_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)"
_GO_DURATION = re.compile(f"(?:{_GO_PART})+")
_GO_PARTS = re.compile(_GO_PART)


def parse_go_duration(value: str) -> float | None:
    """`1h30m0.5s` -> 5400.5; None unless the whole string is a duration."""
    value = value.strip()
    if value == "0":
        return 0.0
    if not _GO_DURATION.fullmatch(value):
        return None
    total = sum(float(number) * _GO_UNITS_S[unit] for number, unit in _GO_PARTS.findall(value))
    return total if math.isfinite(total) else None


_NS_PER = {"h": 3_600_000_000_000, "m": 60_000_000_000, "s": 1_000_000_000, "ms": 1_000_000, "us": 1_000}


def format_go_duration(seconds: float) -> str:
    """Go's Duration.String() as OpenAI's reset headers show it: `12ms`, `1s`, `6m0s`, `1h2m3.5s`."""
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite, got {seconds}")
    ns = max(0, round(seconds * 1e9))
    if ns >= _NS_PER["ms"]:
        ns = round(ns / _NS_PER["ms"]) * _NS_PER["ms"]  # millisecond precision hides float noise
    if ns == 0:
        return "0s"
    if ns < _NS_PER["us"]:
        return f"{ns}ns"
    if ns < _NS_PER["ms"]:
        return _trim(ns / _NS_PER["us"]) + "µs"
    if ns < _NS_PER["s"]:
        return _trim(ns / _NS_PER["ms"]) + "ms"
    hours, rest = divmod(ns, _NS_PER["h"])
    minutes, rest = divmod(rest, _NS_PER["m"])
    secs = _trim(rest / _NS_PER["s"]) + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    return f"{minutes}m{secs}" if minutes else secs


def _trim(value: float) -> str:
    return f"{value:.9f}".rstrip("0").rstrip(".")
