"""Everything a running gateway holds, built once in the app's lifespan and passed in:
no module-level state anywhere else."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import anyio
from sqlalchemy import Engine, text

from gateway.accounting.database import maintain_indexes, make_engine, migrate
from gateway.accounting.hold_and_settle import Accounting
from gateway.accounting.ledger import Ledger
from gateway.accounting.prices import PriceCatalog, every_model_priced
from gateway.accounting.responses_store import ResponseStore
from gateway.accounting.spool import SettlementSpool
from gateway.accounting.tasks import TaskStore
from gateway.accounting.writer import GroupCommitWriter
from gateway.admission.buckets import Buckets, InProcessBuckets
from gateway.admission.gate import AdmissionGate
from gateway.admission.queue import AdmissionQueue
from gateway.caching.response_cache import ResponseCache
from gateway.caching.salts import TenantSalts, load_or_create_secret
from gateway.caching.store import CacheStore, MemoryStore, TolerantStore
from gateway.caching.tool_cache import ToolCache
from gateway.caching.volatility import PrefixHygiene, VolatilityDetector
from gateway.pipeline.responses import ResponsesService
from gateway.pipeline.retry import Retrier
from gateway.pipeline.runner import Pipeline, PipelineParts
from gateway.pipeline.tool_calls import ToolRunner
from gateway.routing.reload import PolicyHolder
from gateway.settings import Settings
from gateway.telemetry.ids import IdSource
from gateway.telemetry.metrics import Metrics
from gateway.tokens.counting import Tokenizers
from gateway.upstreams.health import UpstreamHealth
from gateway.upstreams.pool_monitor import PoolMonitor
from gateway.upstreams.pool_share import SharedHomes
from gateway.upstreams.registry import UpstreamRegistry
from gateway.upstreams.tools import ToolClient
from gateway.verify.signals import Verifier

if TYPE_CHECKING:  # imported only where Redis is configured (see `_shared_state`)
    from redis.asyncio import Redis

log = logging.getLogger("gateway")


@dataclass
class Services:
    settings: Settings
    policies: PolicyHolder
    upstreams: UpstreamRegistry
    metrics: Metrics
    pipeline: Pipeline
    ledger: Ledger
    accounting: Accounting
    writer: GroupCommitWriter
    reader: Engine
    tools: ToolRunner
    responses: ResponsesService
    redis: Redis | None = None
    started_at: float = field(default_factory=time.time)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def build(cls, settings: Settings, catalog: PriceCatalog | None = None) -> Services:
        """`catalog`: one already read from `settings.gateway_pricing_dir` (`gateway serve`
        has read it to check the policy); read here when not given."""
        if settings.gateway_policy is None:
            raise ValueError("no policy file: pass --policy FILE or set GATEWAY_POLICY")
        metrics = Metrics()
        catalog = catalog if catalog is not None else PriceCatalog.load(settings.gateway_pricing_dir)
        upstreams = UpstreamRegistry()
        policies = PolicyHolder(
            settings.gateway_policy,
            check=every_model_priced(catalog),
            on_swap=lambda runtime: upstreams.sync(runtime.policy),
            on_result=lambda result: metrics.policy_reloads.labels(result).inc(),
        )
        # Most requests never need a counted prompt (tokens/prompt_size.py); where the
        # policy makes counting routine, load the encodings now, off the start-up path.
        tokenizers = Tokenizers()
        if policies.current.needs_token_counts():
            tokenizers.preload({t.tokenizer for t in policies.current.targets.values()} | {policies.current.policy.defaults.tokenizer})
        url = settings.effective_database_url()
        writer_engine = make_engine(url, writer=True)
        migrate(writer_engine)
        reader = make_engine(url)
        writer = GroupCommitWriter(writer_engine)
        metrics.watch_ledger(lambda: writer.batches, lambda: writer.ops)
        ledger = Ledger(writer)
        accounting = Accounting(ledger, catalog, TaskStore(writer, reader), SettlementSpool(settings.gateway_var_dir))
        accounting.warm_headroom(reader, policies.current, datetime.now(UTC))
        secret = load_or_create_secret(settings.gateway_secret, settings.gateway_var_dir)
        salts = TenantSalts(secret)
        redis, buckets, store = _shared_state(settings, policies.current.policy.defaults.response_cache_max_bytes)
        retrier = Retrier(UpstreamHealth(redis, settings.gateway_redis_prefix))
        admission = AdmissionGate(AdmissionQueue(buckets))
        pipeline = Pipeline(PipelineParts(
            policies=policies, upstreams=upstreams, metrics=metrics, salts=salts, accounting=accounting, retrier=retrier,
            admission=admission, cache=ResponseCache(store, secret), hygiene=PrefixHygiene(), volatility=VolatilityDetector(),
            verifier=Verifier(), ids=IdSource(), tokenizers=tokenizers))
        metrics.watch_in_flight(lambda: pipeline.serving)
        tools = ToolRunner(policies, ToolClient(), ToolCache(store, secret), accounting)
        responses = ResponsesService(pipeline, ResponseStore(writer, reader))
        return cls(settings, policies, upstreams, metrics, pipeline, ledger, accounting, writer, reader, tools, responses, redis)

    def start_background(self) -> None:
        self.writer.start()
        if self.writer.engine.dialect.name == "postgresql":
            # Off the start-up path: a concurrent index build waits for every older
            # transaction on the server, and the gateway serves correctly without it.
            threading.Thread(target=_maintain_indexes, args=(self.writer.engine,), name="ledger-indexes", daemon=True).start()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.policies.watch(self.settings.gateway_policy_poll_s)))
        self._tasks.append(loop.create_task(_every(self.settings.gateway_sweep_interval_s, self.sweep)))
        shared = SharedHomes(self.redis, self.settings.gateway_redis_prefix) if self.redis is not None else None
        self._tasks.append(loop.create_task(PoolMonitor(self.upstreams, shared).run()))

    async def sweep(self) -> int:
        replayed = await self.accounting.spool.replay(self.ledger)
        if replayed:
            log.warning("booked %d settlements spooled while the ledger was unavailable", replayed)
        expired = await self.ledger.expire_orphans(datetime.now(UTC), self.accounting.orphan_estimate(self.policies.current))
        if expired:
            log.warning("expired %d reservations whose usage was never confirmed", expired)
        await self.responses.store.purge_expired(datetime.now(UTC))
        return expired

    async def readiness(self) -> dict[str, tuple[bool, str]]:
        """Each store the request path needs, with a short reason when it is not usable.
        Anyone who reaches /readyz reads these: they name no file, URL or address (an
        error's own text often does), and the error itself goes to the log."""
        policy = self.policies.current
        detail = f"{len(policy.targets)} models"
        if self.policies.last_error:
            detail += " (the latest edit was rejected; serving the last good policy)"
        checks = {"policy": (True, detail)}
        try:
            await anyio.to_thread.run_sync(self._ping_ledger)
            checks["ledger"] = (True, self.reader.dialect.name)
        except Exception as exc:
            checks["ledger"] = (False, _not_usable("ledger database", exc))
        checks["redis"] = await self._redis_check()
        return checks

    async def _redis_check(self) -> tuple[bool, str]:
        if self.redis is None:
            return True, "not configured: in-process state"
        try:
            await self.redis.ping()
        except Exception as exc:
            return False, _not_usable("Redis", exc)
        return True, "reachable"

    def _ping_ledger(self) -> None:
        with self.reader.connect() as conn:
            conn.execute(text("SELECT 1"))

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.upstreams.aclose()
        await self.tools.client.aclose()
        if self.redis is not None:
            await self.redis.aclose()
        await self.accounting.flush()  # settlements still committing in the background
        await self.writer.stop()
        self.writer.engine.dispose()
        self.reader.dispose()


def _not_usable(component: str, exc: Exception) -> str:
    log.warning("readiness: the %s is not usable: %s: %s", component, type(exc).__name__, exc)
    return f"not usable: {type(exc).__name__} (the gateway's log has the error)"


def _shared_state(settings: Settings, cache_max_bytes: int) -> tuple[Redis | None, Buckets, CacheStore]:
    """Buckets and caches in Redis when REDIS_URL is set, else in this process (the
    in-process cache's size bound is read once, here). The Redis client is imported only
    then: it and the packages it pulls in add to every start-up and serve no purpose
    without Redis."""
    if not settings.redis_url:
        return None, InProcessBuckets(), MemoryStore(cache_max_bytes)
    from redis.asyncio import Redis

    from gateway.admission.redis_buckets import RedisBuckets
    from gateway.caching.redis_store import RedisStore

    redis = Redis.from_url(settings.redis_url)
    prefix = settings.gateway_redis_prefix
    return redis, RedisBuckets(redis, prefix), TolerantStore(RedisStore(redis, prefix))


def _maintain_indexes(engine: Engine) -> None:
    try:
        done = maintain_indexes(engine)
    except Exception:
        log.exception("could not bring the ledger's indexes up to date; queries that need them scan the table "
                      "until the next start tries again")
        return
    for what in done:
        log.info("ledger index %s", what)


async def _every(interval_s: float, job: Callable[[], Awaitable[object]]) -> None:
    while True:
        try:
            await job()
        except Exception:  # a failed sweep is retried next round, never fatal
            log.exception("background job failed")
        await asyncio.sleep(interval_s)
