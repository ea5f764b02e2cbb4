"""A `Pipeline` built from real in-process parts - the policy loader, a SQLite ledger
with its writer thread, in-process token buckets, the in-memory response cache - and
fake upstreams, without `services.py`'s sockets, Redis or PostgreSQL. Retry waits are
recorded, not slept."""

from __future__ import annotations

import asyncio
import copy
import functools
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
from sqlalchemy import Engine, text

from gateway.accounting.database import make_engine, migrate
from gateway.accounting.hold_and_settle import Accounting
from gateway.accounting.ledger import Ledger
from gateway.accounting.price_sources import LitellmMap
from gateway.accounting.prices import PriceCatalog
from gateway.accounting.spool import SettlementSpool
from gateway.accounting.tasks import TaskStore
from gateway.accounting.writer import GroupCommitWriter
from gateway.admission.buckets import InProcessBuckets
from gateway.admission.gate import AdmissionGate
from gateway.admission.queue import AdmissionQueue
from gateway.auth.keys import key_digest
from gateway.caching.response_cache import ResponseCache
from gateway.caching.salts import TenantSalts
from gateway.caching.store import MemoryStore
from gateway.caching.volatility import PrefixHygiene, VolatilityDetector
from gateway.errors import GatewayError
from gateway.pipeline.retry import Retrier
from gateway.pipeline.runner import JsonReply, Pipeline, PipelineParts, StreamReply
from gateway.routing.reload import PolicyHolder
from gateway.telemetry.ids import IdSource
from gateway.telemetry.metrics import Metrics
from gateway.tokens.counting import Tokenizers
from gateway.upstreams.base import Upstream
from gateway.upstreams.health import UpstreamHealth
from gateway.verify.signals import Verifier
from tests.fakes.upstream import FakeUpstream, Reply

T = TypeVar("T")
KEY = "sk-acme"  # tenant `acme`: no limits, no budget
SECRET = b"s" * 32
MILLION = 1_000_000

# Prices per 1M tokens: small costs 1 + 2 per token pair, spare 3 + 6, large 10 + 20.
BASE_POLICY: dict[str, Any] = {
    "version": 1,
    "defaults": {"max_output_tokens": 100, "request_timeout_s": 30,
                 "retry": {"max_attempts": 3, "base_s": 0.5, "cap_s": 8, "budget_ratio": 10, "cooldown_after": 100}},
    "upstreams": {"hosted": {"kind": "openai", "base_url": "http://hosted.test/v1"},
                  "backup": {"kind": "openai", "base_url": "http://backup.test/v1"},
                  "anthropic": {"kind": "anthropic", "base_url": "http://anthropic.test"}},
    "models": {
        "small": {"upstream": "hosted", "upstream_model": "small-v1", "price": {"input": 1, "output": 2}, "fallbacks": ["spare"]},
        "spare": {"upstream": "backup", "price": {"input": 3, "output": 6}},
        "large": {"upstream": "backup", "price": {"input": 10, "output": 20}},
        "claude": {"upstream": "anthropic", "price": {"input": 3, "output": 15}},
    },
    "tenants": {"acme": {"api_keys": [key_digest(KEY)]}},
    "routes": {"checked": {"chain": ["small", "large"], "escalate_when": ["truncated"]}},
}


def policy(**tenants: dict[str, Any]) -> dict[str, Any]:
    """The base policy plus `tenants` (name -> fields; `key` is its raw API key)."""
    result = copy.deepcopy(BASE_POLICY)
    for name, fields in tenants.items():
        fields = dict(fields)
        result["tenants"][name] = {"api_keys": [key_digest(fields.pop("key"))], **fields}
    return result


def pico(prompt: int, completion: int, input_usd: int, output_usd: int) -> int:
    """The cost in pico-dollars of a call priced per 1M tokens in whole dollars."""
    return (prompt * input_usd + completion * output_usd) * MILLION


def upstreams(**scripts: FakeUpstream | Reply) -> dict[str, FakeUpstream]:
    """A fake for each upstream of the base policy: the given ones (a reply scripts one
    of that name), the rest answering `answer()`."""
    made = {name: FakeUpstream(name) for name in BASE_POLICY["upstreams"]}
    for name, given in scripts.items():
        made[name] = given if isinstance(given, FakeUpstream) else FakeUpstream(name, given)
    return made


@functools.cache
def shared_tokenizers() -> Tokenizers:
    """Encoders are read-only once loaded and take ~0.5 s each to load: one set for the
    whole test session."""
    return Tokenizers()


class FakeUpstreams:
    """An `UpstreamSource` handing out the given upstreams by name."""

    def __init__(self, upstreams: Mapping[str, FakeUpstream]) -> None:
        self._upstreams = dict(upstreams)

    def get(self, name: str) -> Upstream:
        return self._upstreams[name]


@dataclass
class FakeGateway:
    pipeline: Pipeline
    upstreams: dict[str, FakeUpstream]
    reader: Engine
    waits: list[float] = field(default_factory=list)  # retry waits asked for, in seconds

    @property
    def accounting(self) -> Accounting:
        return self.pipeline.accounting

    async def call(self, body: Mapping[str, Any] | None = None, *, key: str = KEY, endpoint: str = "chat.completions",
                   **headers: str) -> JsonReply | StreamReply:
        """One client request (headers given with `_` for `-`)."""
        wire = {"authorization": f"Bearer {key}", **{k.replace("_", "-"): v for k, v in headers.items()}}
        return await self.pipeline.run(endpoint, orjson.dumps(body or chat()), wire)

    async def events(self) -> list[dict[str, Any]]:
        """The ledger's usage events, once every booking is committed."""
        return await self._rows("SELECT * FROM usage_events ORDER BY created_at, request_id, attempt")

    async def holds(self) -> list[dict[str, Any]]:
        return await self._rows("SELECT * FROM reservations ORDER BY created_at, id")

    async def budgets(self) -> dict[str, dict[str, Any]]:
        return {row["id"]: row for row in await self._rows("SELECT * FROM budgets")}

    async def _rows(self, query: str) -> list[dict[str, Any]]:
        await self.accounting.flush()
        with self.reader.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(text(query))]


def chat(content: str = "Say hello.", model: str = "small", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}


def migrated_ledger(directory: Path, template: Path | None) -> Path:
    """A migrated SQLite ledger in `directory`: a copy of `template` when given (migrating
    once per test session instead of once per test)."""
    path = directory / "ledger.db"
    if template is not None:
        shutil.copyfile(template, path)
    else:
        engine = make_engine(f"sqlite:///{path}", writer=True)
        migrate(engine)
        engine.dispose()
    return path


@asynccontextmanager
async def fake_gateway(directory: Path, upstreams: Mapping[str, FakeUpstream], policy_fields: Mapping[str, Any] | None = None,
                       *, template: Path | None = None) -> AsyncIterator[FakeGateway]:
    policy_file = directory / "policy.json"
    policy_file.write_bytes(orjson.dumps(policy_fields or BASE_POLICY))
    url = f"sqlite:///{migrated_ledger(directory, template)}"
    writer = GroupCommitWriter(make_engine(url, writer=True))
    reader = make_engine(url)
    writer.start()
    accounting = Accounting(Ledger(writer), PriceCatalog([], LitellmMap({}), "no price map: the policy prices every model"), TaskStore(writer, reader),
                            SettlementSpool(directory / "spool"))
    waits: list[float] = []

    async def record_wait(seconds: float) -> None:
        waits.append(seconds)

    parts = PipelineParts(
        policies=PolicyHolder(policy_file), upstreams=FakeUpstreams(upstreams), metrics=Metrics(), salts=TenantSalts(SECRET),
        accounting=accounting, retrier=Retrier(UpstreamHealth(), sleep=record_wait),
        admission=AdmissionGate(AdmissionQueue(InProcessBuckets())), cache=ResponseCache(MemoryStore(1024 * 1024), SECRET),
        hygiene=PrefixHygiene(), volatility=VolatilityDetector(), verifier=Verifier(), ids=IdSource(),
        tokenizers=shared_tokenizers())
    gateway = FakeGateway(Pipeline(parts), dict(upstreams), reader, waits)
    try:
        yield gateway
    finally:
        await accounting.flush()
        await writer.stop()
        writer.engine.dispose()
        reader.dispose()


def with_gateway(directory: Path, upstreams: Mapping[str, FakeUpstream], scenario: Callable[[FakeGateway], Awaitable[T]],
                 policy_fields: Mapping[str, Any] | None = None) -> T:
    """Run `scenario` against a fake gateway on a fresh event loop; its result."""

    async def main() -> T:
        async with fake_gateway(directory, upstreams, policy_fields) as gateway:
            return await scenario(gateway)

    return asyncio.run(main())


@dataclass
class Outcome:
    replies: list[Any]  # each call's reply, or the GatewayError it raised
    events: list[dict[str, Any]]  # the ledger's usage events
    holds: list[dict[str, Any]]  # the ledger's reservations
    waits: list[float]  # retry waits asked for, in seconds


def make_calls(directory: Path, fakes: Mapping[str, FakeUpstream], *calls: Mapping[str, Any],
               policy_fields: Mapping[str, Any] | None = None) -> Outcome:
    """Make `calls` one after another (each: a body under `body`, the rest headers as
    `FakeGateway.call` takes them); what came of them."""

    async def scenario(gw: FakeGateway) -> Outcome:
        replies: list[Any] = []
        for call in calls:
            fields = dict(call)
            body = fields.pop("body", chat())
            try:
                replies.append(await gw.call(body, **fields))
            except GatewayError as exc:
                replies.append(exc)
        return Outcome(replies, await gw.events(), await gw.holds(), gw.waits)

    return with_gateway(directory, fakes, scenario, policy_fields)
