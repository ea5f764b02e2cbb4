"""A self-hosted pool's own token counters: vLLM's Prometheus `/metrics`.

vLLM keeps cumulative counters since it started, not a history, so usage over a window
is the difference of two scrapes: `vllm:prompt_tokens_total`,
`vllm:generation_tokens_total` and `vllm:request_success_total` (every finished
reason, aborts included: an aborted request still used the GPU). Each replica is
differenced on its own, so one replica's restart (its counters start again at zero) is
seen and reported instead of silently cancelling another replica's growth.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from gateway.accounting.reconcile import ImportFailed, ProviderUsage, merge_rows

PROMPT = "vllm:prompt_tokens_total"
GENERATION = "vllm:generation_tokens_total"
SUCCESS = "vllm:request_success_total"
IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")
SOURCE = "vllm metrics"


class FetchText(Protocol):
    """GET `url`; the body as text. Raises on HTTP errors.
    `gateway.upstreams.provider_reports.ProviderReportClient.text` is the real one."""

    def __call__(self, url: str) -> str: ...


_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Counters:
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests: float = 0.0
    in_flight: float = 0.0  # a gauge: requests running or waiting at scrape time


@dataclass(frozen=True, slots=True)
class Scrape:
    at: datetime
    by_replica: Mapping[str, Mapping[str, Counters]]  # replica URL -> model_name -> counters

    def in_flight(self) -> int:
        return round(sum(c.in_flight for models in self.by_replica.values() for c in models.values()))


def parse_metrics(text: str) -> dict[str, Counters]:
    """Per `model_name` label, summed over engines and finished reasons."""
    sums: dict[str, dict[str, float]] = {}
    wanted = {PROMPT, GENERATION, SUCCESS, *IN_FLIGHT}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) not in wanted:
            continue
        name, labels, raw = match.groups()
        model = dict(_LABEL.findall(labels or "")).get("model_name", "")
        try:
            value = float(raw)
        except ValueError:
            raise ImportFailed(f"{SOURCE}: {name} has a value that is not a number: {raw!r}") from None
        per_model = sums.setdefault(model, {})
        key = "in_flight" if name in IN_FLIGHT else name
        per_model[key] = per_model.get(key, 0.0) + value
    return {
        model: Counters(v.get(PROMPT, 0.0), v.get(GENERATION, 0.0), v.get(SUCCESS, 0.0), v.get("in_flight", 0.0))
        for model, v in sums.items()
    }


def metrics_url(replica_url: str) -> str:
    """Replicas are configured by their OpenAI base (`.../v1`); metrics live at the root."""
    return replica_url.rstrip("/").removesuffix("/v1") + "/metrics"


def scrape(fetch: FetchText, replica_urls: Sequence[str], now: Callable[[], datetime] | None = None) -> Scrape:
    if not replica_urls:
        raise ImportFailed(f"{SOURCE}: the upstream has no replicas to scrape")
    by_replica = {url: parse_metrics(fetch(metrics_url(url))) for url in replica_urls}
    return Scrape((now or _utcnow)(), by_replica)


def window_rows(before: Scrape, after: Scrape, key_id: str | None = None) -> tuple[list[ProviderUsage], list[str]]:
    """Usage between two scrapes, one row per model dated by the window's start, and
    notes on anything that makes the totals less than exact."""
    if after.at <= before.at:
        raise ImportFailed(f"{SOURCE}: the second scrape ({after.at}) is not after the first ({before.at})")
    rows, notes = [], []
    for replica, models in after.by_replica.items():
        earlier = before.by_replica.get(replica, {})
        for model, now in models.items():
            then = earlier.get(model, Counters())
            reset = now.prompt_tokens < then.prompt_tokens or now.generation_tokens < then.generation_tokens or now.requests < then.requests
            if reset:
                # Counters start again at zero when a server restarts; what ran before
                # the restart inside the window is lost, so this is a lower bound.
                notes.append(f"{replica}: counters for {model} went down between scrapes (a restart?); its totals are a lower bound")
                then = Counters()
            rows.append(ProviderUsage(
                day=before.at.astimezone(UTC).date(),
                model=model,
                key_id=key_id,
                input_tokens=round(now.prompt_tokens - then.prompt_tokens),
                cached_tokens=None,
                output_tokens=round(now.generation_tokens - then.generation_tokens),
                requests=round(now.requests - then.requests),
                cost_pico=None,
                source=SOURCE,
            ))
    for replica in before.by_replica.keys() - after.by_replica.keys():
        notes.append(f"{replica}: scraped at the start but not at the end; left out")
    for label, snap in (("start", before), ("end", after)):
        if snap.in_flight():
            notes.append(
                f"{snap.in_flight()} requests were running or waiting at the window's {label}: vLLM counts their "
                "tokens when they finish, the ledger by when they started, so they may fall on different sides"
            )
    return merge_rows(rows), notes


def _utcnow() -> datetime:
    return datetime.now(UTC)
