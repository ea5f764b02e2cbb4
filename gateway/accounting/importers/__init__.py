"""Importers read what a provider billed into `ProviderUsage` rows; this module picks
one from a provider spec and runs a whole reconciliation (the CLI's and the admin
API's entry points).

Provider specs:
    UPSTREAM                 an upstream in the policy: `kind: openai` reads the OpenAI
                             usage + costs APIs, `kind: anthropic` Anthropic's Admin API
                             usage and cost reports (with `admin_key_env`), `kind: vllm`
                             the pool's counters
    vllm:UPSTREAM[@SECONDS]  scrape the pool's `/metrics`, wait SECONDS (default 60),
                             scrape again, and compare that window (counters keep no
                             history, so a vLLM window is always "from now")
    csv:[UPSTREAM:]PATH      a CSV export (columns: see csv_export)
    anthropic:[UPSTREAM:]PATH  a saved Anthropic usage report (one page or a list)
UPSTREAM after `csv:`/`anthropic:` may be left out when the policy has one hosted upstream.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, Protocol, TextIO

from sqlalchemy import Engine

from gateway.accounting.database import make_engine, normalise_url, table_names
from gateway.accounting.importers import anthropic_admin, anthropic_usage, csv_export, openai_usage, vllm_metrics
from gateway.accounting.prices import PriceCatalog, PricingInvalid
from gateway.accounting.reconcile import ImportFailed, ProgressCallback, ProviderUsage, reconcile
from gateway.routing.loader import PolicyInvalid, load_policy_file
from gateway.routing.policy import Policy, Upstream
from gateway.settings import Settings
from gateway.upstreams.provider_reports import ProviderReportClient, ProviderReportError

__all__ = ["ProviderSpec", "ReportClient", "TextProgress", "import_provider_rows", "parse_provider", "reconcile_upstream", "run_reconcile"]

DEFAULT_VLLM_WINDOW_S = 60.0
EXIT_MATCHED, EXIT_DIFFERENT, EXIT_FAILED = 0, 1, 2


class ReportClient(Protocol):
    def json(self, url: str, params: Mapping[str, openai_usage.QueryValue]) -> dict[str, Any]: ...
    def text(self, url: str) -> str: ...
    def close(self) -> None: ...


ClientFactory = Callable[[Mapping[str, str]], ReportClient]  # the request headers (credentials) -> client
ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    kind: Literal["openai", "vllm", "csv", "anthropic", "anthropic_api"]
    upstream: str
    path: Path | None = None
    window_s: float = DEFAULT_VLLM_WINDOW_S


@dataclass(slots=True)
class Imported:
    rows: list[ProviderUsage]
    since: date | datetime  # datetimes for a metrics window
    until: date | datetime
    source: str
    notes: list[str] = field(default_factory=list)


def parse_provider(spec: str, policy: Policy) -> ProviderSpec:
    """Raises ValueError naming what is wrong with `spec`."""
    kind, _, rest = spec.partition(":")
    if kind in ("csv", "anthropic") and rest:
        named, sep, path = rest.partition(":")
        if not (sep and named in policy.upstreams):
            named, path = _only_hosted(policy, spec), rest
        return ProviderSpec("csv" if kind == "csv" else "anthropic", named, Path(path))
    if kind == "vllm" and rest:
        name, _, seconds = rest.partition("@")
        _upstream(policy, name, spec)
        try:
            window = float(seconds) if seconds else DEFAULT_VLLM_WINDOW_S
        except ValueError:
            raise ValueError(f"provider `{spec}`: the window after `@` must be seconds") from None
        if not 0 < window <= 86_400:
            raise ValueError(f"provider `{spec}`: the window must be between 0 and 86400 seconds")
        return ProviderSpec("vllm", name, window_s=window)
    upstream = _upstream(policy, spec, spec)
    if upstream.kind == "vllm":
        return ProviderSpec("vllm", spec)
    return ProviderSpec("anthropic_api" if upstream.kind == "anthropic" else "openai", spec)


def _upstream(policy: Policy, name: str, spec: str) -> Upstream:
    if name not in policy.upstreams:
        raise ValueError(f"provider `{spec}`: no upstream `{name}` in the policy (it has: {', '.join(sorted(policy.upstreams))}); "
                         "or use csv:PATH, anthropic:PATH, vllm:UPSTREAM")
    return policy.upstreams[name]


def _only_hosted(policy: Policy, spec: str) -> str:
    hosted = [name for name, u in policy.upstreams.items() if u.kind != "vllm"]
    if len(hosted) != 1:
        raise ValueError(f"provider `{spec}`: name the upstream to compare with, e.g. `{spec.split(':')[0]}:UPSTREAM:PATH`")
    return hosted[0]


def import_provider_rows(spec: ProviderSpec, policy: Policy, since: date, until: date, clients: ClientFactory,
                         on_progress: ProgressCallback | None = None, sleep: Callable[[float], None] = time.sleep) -> Imported:
    upstream = policy.upstreams[spec.upstream]
    if spec.kind == "csv" and spec.path is not None:
        return Imported(csv_export.read_csv_file(spec.path, since, until), since, until, f"CSV export {spec.path}")
    if spec.kind == "anthropic" and spec.path is not None:
        return Imported(anthropic_usage.read_report_file(spec.path, since, until), since, until, f"Anthropic usage report {spec.path}")
    client = clients(_report_headers(spec, upstream))
    try:
        if spec.kind == "vllm":
            return _vllm_window(spec, upstream.urls(), upstream.provider_key_id, client, on_progress, sleep)
        base = upstream.urls()[0]
        if spec.kind == "anthropic_api":
            rows, notes = anthropic_admin.import_anthropic_admin(client.json, base + "/v1", since, until, on_progress=on_progress)
            return Imported(rows, since, until, f"Anthropic Admin API usage and cost reports at {base}", notes)
        rows = openai_usage.import_openai_usage(client.json, base, since, until, on_progress=on_progress)
        return Imported(rows, since, until, f"OpenAI usage and costs APIs at {base}")
    except ProviderReportError as exc:
        raise ImportFailed(str(exc)) from exc
    finally:
        client.close()


def _report_headers(spec: ProviderSpec, upstream: Upstream) -> dict[str, str]:
    """The credentials for the provider's report APIs: its admin key (`admin_key_env`);
    for OpenAI the inference key when no admin key is named. The key goes in a header
    only, never in a message."""
    if spec.kind == "vllm":
        return {}
    if spec.kind == "anthropic_api":
        if upstream.admin_key_env is None:
            raise ImportFailed(f"upstream `{spec.upstream}`: Anthropic's usage and cost reports need an Admin API key "
                               "(sk-ant-admin...), not the inference key: set `admin_key_env` on the upstream")
        return {"x-api-key": _key(spec, upstream.admin_key_env, "admin_key_env"), "anthropic-version": ANTHROPIC_VERSION}
    name, field = (upstream.admin_key_env, "admin_key_env") if upstream.admin_key_env else (upstream.api_key_env, "api_key_env")
    if name is None:
        raise ImportFailed(f"upstream `{spec.upstream}`: set its admin_key_env (or api_key_env) to read its usage reports")
    return {"authorization": f"Bearer {_key(spec, name, field)}"}


def _key(spec: ProviderSpec, env: str, field: str) -> str:
    key = os.environ.get(env, "")
    if not key:
        raise ImportFailed(f"upstream `{spec.upstream}`: set {env} (its {field}) to read its usage reports")
    return key


def _vllm_window(spec: ProviderSpec, replicas: list[str], key_id: str | None, client: ReportClient,
                 on_progress: ProgressCallback | None, sleep: Callable[[float], None]) -> Imported:
    before = vllm_metrics.scrape(client.text, replicas)
    deadline = time.monotonic() + spec.window_s
    while (left := deadline - time.monotonic()) > 0:
        sleep(min(left, 1.0))
        if on_progress is not None:
            on_progress(round(spec.window_s - max(left - 1.0, 0)), "waiting for the window to end")
    after = vllm_metrics.scrape(client.text, replicas)
    rows, notes = vllm_metrics.window_rows(before, after, key_id)
    return Imported(rows, before.at, after.at, f"vLLM /metrics of {len(replicas)} replica(s)", notes)


def run_reconcile(policy_path: str, database_url: str, provider: str, since: date, until: date | None, show_progress: bool,
                  *, pricing_dir: Path | None = None, clients: ClientFactory | None = None,
                  stderr: TextIO | None = None) -> tuple[int, str]:
    """`gateway reconcile`: (exit code, report text). Exit 0 when everything matched,
    1 when there are differences (each with its reasons), 2 when it could not run."""
    until = until or _tomorrow()
    try:
        policy = load_policy_file(policy_path)
        spec = parse_provider(provider, policy)
        engine = _ledger_engine(database_url)
    except PolicyInvalid as exc:
        return EXIT_FAILED, str(exc)
    except ValueError as exc:
        return EXIT_FAILED, f"error: {exc}"
    progress = None
    if show_progress:
        expected = round(spec.window_s) if spec.kind == "vllm" else openai_usage.expected_pages(since, until)
        progress = TextProgress(expected, stderr, "s" if spec.kind == "vllm" else "pages")
    try:
        imported = import_provider_rows(spec, policy, since, until, clients or _http_clients, progress)
        if progress is not None:
            progress.finish(f"{len(imported.rows)} provider rows")
        catalog, notes = _catalog(pricing_dir)
        report = reconcile(engine, policy, spec.upstream, imported.rows, imported.since, imported.until,
                           catalog=catalog, source=imported.source)
    except (ImportFailed, ValueError) as exc:
        return EXIT_FAILED, f"error: {exc}"
    finally:
        engine.dispose()
    report = replace(report, notes=(*imported.notes, *notes, *report.notes))
    return (EXIT_MATCHED if report.matched else EXIT_DIFFERENT), report.to_text()


async def reconcile_upstream(engine: Engine, policy: Policy, provider: str, since: date, until: date | None = None,
                             *, catalog: PriceCatalog | None = None, clients: ClientFactory | None = None) -> dict[str, Any]:
    """The admin API's entry point: the report as JSON. Raises ValueError for a bad
    request (unknown provider, empty window), ImportFailed when the provider's report
    cannot be read and PricingInvalid when litellm's price map cannot. Runs in a worker
    thread: the fetches, the map and the ledger query block."""

    def run() -> dict[str, Any]:
        spec = parse_provider(provider, policy)
        if catalog is not None:
            catalog.read_map()
        end = until or _tomorrow()
        imported = import_provider_rows(spec, policy, since, end, clients or _http_clients)
        report = reconcile(engine, policy, spec.upstream, imported.rows, imported.since, imported.until,
                           catalog=catalog, source=imported.source)
        return replace(report, notes=(*imported.notes, *report.notes)).to_json()

    return await asyncio.to_thread(run)


def _http_clients(headers: Mapping[str, str]) -> ReportClient:
    return ProviderReportClient(extra_headers=headers)


def _ledger_engine(database_url: str) -> Engine:
    url = normalise_url(database_url)
    # Reconciliation only reads: never create an empty ledger where none is.
    if url.startswith("sqlite") and "///" in url and not Path(url.split("///", 1)[1]).exists():
        raise ValueError(f"no ledger database at {url.split('///', 1)[1]}")
    engine = make_engine(url)
    if "usage_events" not in table_names(engine):
        engine.dispose()
        raise ValueError(f"{database_url} has no ledger tables (is it the gateway's DATABASE_URL?)")
    return engine


def _catalog(pricing_dir: Path | None) -> tuple[PriceCatalog | None, list[str]]:
    try:
        catalog = PriceCatalog.load(pricing_dir or Settings().gateway_pricing_dir)
        catalog.read_map()
        return catalog, []
    except PricingInvalid as exc:
        return None, [f"pricing files unreadable ({'; '.join(exc.problems)}): token differences priced with policy prices only"]


def _tomorrow() -> date:
    return datetime.now(UTC).date() + timedelta(days=1)


class TextProgress:
    """A one-line progress bar on stderr: `[#####.....]  50%  5 pages  note`. `expected`
    is a guess (page counts are not known up front), so it stops at 99% until `finish()`."""

    WIDTH = 30

    def __init__(self, expected: int, stream: TextIO | None = None, unit: str = "pages") -> None:
        self.expected = max(expected, 1)
        self.stream = stream if stream is not None else sys.stderr
        self.unit = unit
        self._last_len = 0

    def __call__(self, done: int, note: str) -> None:
        self._draw(min(done / self.expected, 0.99), f"{done} {self.unit}  {note}")

    def finish(self, note: str = "done") -> None:
        self._draw(1.0, note)
        self.stream.write("\n")
        self.stream.flush()

    def _draw(self, fraction: float, text: str) -> None:
        filled = int(fraction * self.WIDTH)
        line = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {int(fraction * 100):3d}%  {text}"
        # `\r` returns to the line start but does not erase: pad over the longer old line.
        self.stream.write("\r" + line.ljust(self._last_len))
        self.stream.flush()
        self._last_len = len(line)
