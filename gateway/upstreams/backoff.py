"""When to retry an upstream call and how long to wait first: pure policy, no sleeping.

The retry module asks `is_retryable` about a failure, `RetryBudget.allow` whether
another attempt is affordable, and `retry_delay` how long to wait - the provider's
word (retry-after, then its reset headers) when it gave one, else exponential
backoff with full jitter so many clients do not retry in step.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

from gateway.upstreams.ratelimit_headers import ProviderLimits

# Error kinds: what went wrong besides (or instead of) an HTTP status.
HTTP = "http"  # the upstream answered; the status decides
CONNECT = "connect"  # could not connect, or the connection dropped before a response
TIMEOUT = "timeout"
BUDGET = "budget"  # our own budget refused the request
QUOTA = "quota"  # the provider account is out of money or quota (e.g. a spend limit)

RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
_TRANSPORT_KINDS = frozenset({CONNECT, TIMEOUT})
_NEVER_KINDS = frozenset({BUDGET, QUOTA})

# 2**62 x any sane base is far past any cap; bounding the exponent avoids float overflow.
_MAX_EXPONENT = 62


def is_retryable(status: int | None, error_kind: str) -> bool:
    """Retry transport failures and transient statuses; never client errors, budget or
    quota refusals (retrying those only repeats the refusal and costs attempts)."""
    if error_kind in _NEVER_KINDS:
        return False
    if error_kind in _TRANSPORT_KINDS:
        return True
    return status in RETRYABLE_STATUSES


def classify_http_error(status: int, error_code: str | None, message: str, provider: ProviderLimits | None) -> str:
    """QUOTA for a 429 that is about money, not rate (OpenAI's `insufficient_quota`, or
    Anthropic's "spend limit" rate_limit_error) when no retry-after promises a recovery;
    else HTTP."""
    if status != 429 or (provider is not None and provider.retry_after_s is not None):
        return HTTP
    text = message.lower()
    if error_code == "insufficient_quota" or "spend limit" in text or "quota" in text or "credit balance" in text:
        return QUOTA
    return HTTP


def retry_delay(
    attempt: int, provider: ProviderLimits | None, *, base_s: float = 0.5, cap_s: float = 8.0, rng: random.Random
) -> float:
    """Seconds to wait before retry number `attempt` (0 for the first retry).

    Honours, in order: retry-after-ms / retry-after (already merged by the header
    parser), then the reset of an exhausted limit, else full jitter:
    uniform(0, min(cap_s, base_s * 2**attempt)). The provider's own delays are not
    capped: waiting less than it asked for only earns another 429. Whether that delay
    fits the request's deadline is the caller's decision.
    """
    if provider is not None:
        if provider.retry_after_s is not None:
            return provider.retry_after_s
        reset = _exhausted_reset(provider)
        if reset is not None:
            return reset
    ceiling = min(cap_s, base_s * 2.0 ** min(max(attempt, 0), _MAX_EXPONENT))
    return rng.uniform(0.0, ceiling)


def _exhausted_reset(provider: ProviderLimits) -> float | None:
    # Only a limit with nothing left explains the failure; OpenAI sends reset headers on
    # every response, and waiting out a healthy limit's reset after a 500 would be wrong.
    resets = [
        reset
        for remaining, reset in (
            (provider.requests_remaining, provider.requests_reset_s),
            (provider.tokens_remaining, provider.tokens_reset_s),
        )
        if remaining is not None and remaining <= 0 and reset is not None
    ]
    return max(resets) if resets else None


class RetryBudget:
    """Caps retries: at most `max_attempts` attempts in all (per request), and retries at
    most `ratio` x first attempts (plus `min_retries` slack) over the last `window_s`
    (per task or per upstream), so a failing upstream sees ~1.2x its load, not 3x.
    Typical use: one budget per request (max_attempts) and one per task (ratio), both
    told of every attempt; a retry goes ahead only when both allow it.

    The sliding window is approximated from two fixed windows (this one's counts plus
    the previous one's, weighted by how much of it the sliding window still covers), so
    memory stays constant however many attempts there are.
    """

    def __init__(
        self,
        *,
        max_attempts: int | None = None,
        ratio: float | None = None,
        min_retries: int = 3,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self._max_attempts = max_attempts
        self._ratio = ratio
        self._min_retries = min_retries
        self._window_s = window_s
        self._clock = clock
        self.attempts = 0
        self._window_start = clock()
        self._current = [0, 0]  # first attempts, retries in the current window
        self._previous = [0, 0]

    def allow(self) -> bool:
        """May one more retry be made now?"""
        if self._max_attempts is not None and self.attempts >= self._max_attempts:
            return False
        if self._ratio is None:
            return True
        firsts, retries = self._recent()
        return retries + 1 <= self._min_retries + self._ratio * firsts

    def record_attempt(self, is_retry: bool) -> None:
        self._roll()
        self.attempts += 1
        self._current[1 if is_retry else 0] += 1

    def _recent(self) -> tuple[float, float]:
        self._roll()
        overlap = 1.0 - (self._clock() - self._window_start) / self._window_s
        return (
            self._current[0] + self._previous[0] * overlap,
            self._current[1] + self._previous[1] * overlap,
        )

    def _roll(self) -> None:
        elapsed = self._clock() - self._window_start
        if elapsed < self._window_s:
            return
        windows = math.floor(elapsed / self._window_s)
        self._previous = self._current if windows == 1 else [0, 0]
        self._current = [0, 0]
        self._window_start += windows * self._window_s
