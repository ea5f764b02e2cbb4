"""A self-hosted pool end to end: vLLM simulator replicas as real processes, the hosted
simulator as the model's fallback, the gateway on a real socket, the openai SDK as the
client (its own retries off, so every failure it saw would be the gateway's).

- a replica SIGKILLed mid-load: no request fails, and each tenant's requests settle
  again on one surviving replica;
- a saturated pool: requests spill to the fallback within their deadline, flagged and
  booked with the reason, and come back to the pool once it drains;
- GET /admin/pool: what an operator sees of the pool."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai

from gateway.app import create_app
from gateway.auth.keys import key_digest, new_api_key
from gateway.settings import Settings
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from tests.support.processes import VllmReplicaProcess, vllm_replicas
from tests.support.servers import run_asgi_in_thread
from tests.support.stack import ADMIN_KEY, UPSTREAM_KEY

TENANTS = [f"tenant{i}" for i in range(6)]
SYSTEMS = {t: f"You are the assistant of {t}. " + " ".join(f"Rule {n} of {t} is to be brief." for n in range(40)) for t in TENANTS}


@dataclass
class PoolStack:
    gateway: str  # base URL ending in /v1
    keys: dict[str, str]  # tenant -> API key
    replicas: list[VllmReplicaProcess]
    ledger: Path

    def client(self, tenant: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.gateway, api_key=self.keys[tenant], max_retries=0, timeout=30)

    def admin(self, path: str) -> httpx.Response:
        return httpx.get(self.gateway.removesuffix("/v1") + path, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)

    def pool_view(self) -> dict[str, Any]:
        response = self.admin("/admin/pool")
        response.raise_for_status()
        pools: list[dict[str, Any]] = response.json()["pools"]
        return pools[0]

    def attempts(self) -> list[sqlite3.Row]:
        """Every upstream attempt the ledger has booked, in order."""
        with contextlib.closing(sqlite3.connect(self.ledger)) as db:
            db.row_factory = sqlite3.Row
            return db.execute("SELECT request_id, attempt, tenant, model, upstream, replica, status, error FROM usage_events"
                              " WHERE kind = 'model' ORDER BY id").fetchall()


def policy_text(hosted: str, replicas: list[str], digests: dict[str, str], pool: str, timeout_s: float) -> str:
    tenants = "".join(f"  {t}:\n    api_keys: [\"{d}\"]\n" for t, d in digests.items())
    return textwrap.dedent(f"""\
        version: 1
        defaults:
          request_timeout_s: {timeout_s}
        upstreams:
          hosted:
            kind: openai
            base_url: {hosted}/v1
            api_key_env: GATEWAY_TEST_UPSTREAM_KEY
          pool:
            kind: vllm
            replicas: [{", ".join(replicas)}]
            pool: {pool}
        models:
          gpt-4o-mini:
            upstream: hosted
            price: {{input: 0.15, cached_input: 0.075, output: 0.60}}
          pool-model:
            upstream: pool
            price: {{input: 0.05, cached_input: 0.01, output: 0.20}}
            fallbacks: [gpt-4o-mini]
        tenants:
        """) + tenants


@contextlib.contextmanager
def pool_stack(tmp_path: Path, replica_flags: list[str], pool: str, count: int = 3, timeout_s: float = 20.0) -> Iterator[PoolStack]:
    os.environ["GATEWAY_TEST_UPSTREAM_KEY"] = UPSTREAM_KEY
    keys = {t: new_api_key() for t in TENANTS}
    with vllm_replicas(count, ["--model", "pool-model", *replica_flags], tmp_path) as replicas, \
            run_asgi_in_thread(create_hosted_app(HostedSimConfig())) as hosted:
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_text(hosted, [r.url for r in replicas], {t: key_digest(k) for t, k in keys.items()}, pool, timeout_s))
        var = tmp_path / "var"
        settings = Settings(gateway_policy=policy, gateway_var_dir=var, gateway_admin_key=ADMIN_KEY,
                            database_url=f"sqlite:///{var / 'ledger.db'}")
        with run_asgi_in_thread(create_app(settings)) as gateway:
            yield PoolStack(gateway + "/v1", keys, replicas, var / "ledger.db")


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(0.05)


async def ask(client: openai.AsyncOpenAI, tenant: str, question: str, max_tokens: int = 8) -> Any:
    """One chat call as a user makes it; the raw response, for its headers."""
    messages = [{"role": "system", "content": SYSTEMS[tenant]}, {"role": "user", "content": question}]
    return await client.chat.completions.with_raw_response.create(model="pool-model", messages=messages,  # type: ignore[arg-type]
                                                                  max_tokens=max_tokens)


def settled_on_one_replica(attempts: list[sqlite3.Row], tenant: str, last: int, avoid: str) -> str | None:
    """The replica that served the tenant's last `last` successful attempts, if it was
    one and the same and not `avoid`."""
    served = [a["replica"] for a in attempts if a["tenant"] == tenant and a["status"] == "ok" and a["upstream"] == "pool"]
    tail = set(served[-last:])
    return next(iter(tail)) if len(served) >= last and len(tail) == 1 and avoid not in tail else None


def test_a_replica_killed_mid_load_fails_no_request_and_affinity_reforms_on_the_survivors(tmp_path: Path) -> None:
    flags = ["--prefill-s-per-token", "0.0002", "--decode-s-per-token", "0.004", "--max-num-seqs", "16"]
    with pool_stack(tmp_path, flags, "{scrape_interval_s: 0.2}") as stack:
        failures: list[str] = []
        sent = 0
        stop = asyncio.Event()

        async def worker(n: int) -> None:
            nonlocal sent
            clients = {t: stack.client(t) for t in TENANTS}
            while not stop.is_set():
                tenant = TENANTS[(n + sent) % len(TENANTS)]
                sent += 1
                try:
                    await ask(clients[tenant], tenant, f"question {sent}")
                except openai.APIError as exc:
                    failures.append(f"{tenant}: {exc}")
            for client in clients.values():
                await client.close()

        async def scenario() -> str:
            workers = [asyncio.create_task(worker(n)) for n in range(6)]
            try:
                # Affinity first: every tenant settled on one replica.
                await asyncio.to_thread(wait_for, "each tenant on one replica before the kill",
                                        lambda: all(settled_on_one_replica(stack.attempts(), t, 5, "-") for t in TENANTS))
                homes = {t: settled_on_one_replica(stack.attempts(), t, 5, "-") for t in TENANTS}
                victim = next(r for r in stack.replicas if r.url in homes.values())
                # Killed while it is serving: requests in flight there when it dies.
                await asyncio.to_thread(wait_for, "the victim busy",
                                        lambda: httpx.get(victim.root + "/sim/stats", timeout=5).json()["running"] > 0)
                victim.kill()
                killed_at = len(stack.attempts())
                await asyncio.to_thread(
                    wait_for, "each tenant settled again on one surviving replica",
                    lambda: all(settled_on_one_replica(stack.attempts()[killed_at:], t, 5, victim.url) for t in TENANTS), 30.0)
                return victim.url
            finally:
                stop.set()
                await asyncio.gather(*workers)

        victim_url = asyncio.run(scenario())
        attempts = stack.attempts()
        assert failures == [], f"{len(failures)} of {sent} requests failed: {failures[:3]}"
        cut = [a for a in attempts if a["replica"] == victim_url and a["status"] != "ok"]
        assert cut, "requests were in flight on the replica when it died"
        retried = {a["request_id"] for a in cut}
        assert all(any(b["request_id"] == rid and b["status"] == "ok" for b in attempts) for rid in retried), \
            "each request the dead replica dropped was answered by another attempt"
        after = {settled_on_one_replica(attempts, t, 5, victim_url) for t in TENANTS}
        assert len(after) >= 2, "the tenants spread over the survivors, not all onto one"
        view = stack.pool_view()
        dead = next(r for r in view["replicas"] if r["url"] == victim_url)
        assert dead["healthy"] is False and dead["ejected_because"]


def test_a_saturated_pool_spills_to_the_fallback_in_time_booked_with_the_reason_and_comes_back_once_drained(tmp_path: Path) -> None:
    # One request at a time per replica, ~1 s each: a burst of 10 would take ~5 s on the
    # pool, past the 3 s deadline; the fallback answers at once.
    flags = ["--max-num-seqs", "1", "--decode-s-per-token", "0.1"]
    pool = "{scrape_interval_s: 0.2, max_num_seqs: 1, max_queue_wait_s: 0.5}"
    with pool_stack(tmp_path, flags, pool, count=2, timeout_s=3.0) as stack:

        async def one(tenant: str, question: str) -> tuple[str | None, str, float]:
            began = time.monotonic()
            async with stack.client(tenant) as client:
                raw = await ask(client, tenant, question, max_tokens=10)
            return raw.headers.get("x-gateway-spill"), raw.parse().model, time.monotonic() - began

        async def sequential(count: int) -> list[tuple[str | None, str, float]]:
            return [await one(TENANTS[i % len(TENANTS)], f"warm {i}") for i in range(count)]

        # The pool learns how long a request holds a slot from the replicas' metrics; the
        # tenants' prefixes get homes on both replicas after the first requests.
        def learned() -> bool:
            warm = asyncio.run(sequential(len(TENANTS)))
            assert all(spill is None for spill, _, _ in warm)
            return all(r["slot_time_s"] for r in stack.pool_view()["replicas"])

        wait_for("both replicas' slot times learned", learned, 60.0)

        async def burst() -> list[tuple[str | None, str, float]]:
            return list(await asyncio.gather(*(one(TENANTS[i % len(TENANTS)], f"burst {i}") for i in range(10))))

        answers = asyncio.run(burst())
        spilled = [a for a in answers if a[0] is not None]
        assert spilled and {a[0] for a in spilled} == {"saturated"}
        assert all(model.startswith("gpt-4o-mini") for _, model, _ in spilled), "the hosted fallback answered them"
        assert all(seconds < 3.0 for _, _, seconds in answers), "every request answered within its deadline"
        assert len(spilled) < len(answers), "the pool still took what it could start in time"

        wait_for("the ledger has booked the burst", lambda: sum(a["status"] == "spilled" for a in stack.attempts()) == len(spilled))
        attempts = stack.attempts()
        for row in (a for a in attempts if a["status"] == "spilled"):
            assert row["upstream"] == "pool" and "(saturated)" in row["error"]
            assert any(b["request_id"] == row["request_id"] and b["upstream"] == "hosted" and b["status"] == "ok" for b in attempts)

        def drained() -> bool:
            return all(r["in_flight"] == 0 and r["running"] == 0 and r["waiting"] == 0 for r in stack.pool_view()["replicas"])

        wait_for("the pool drained", drained)
        after = asyncio.run(sequential(3))
        assert [spill for spill, _, _ in after] == [None] * 3
        assert all(model == "pool-model" for _, model, _ in after), "back on the pool"


def test_admin_pool_shows_replicas_load_cache_homes_and_the_cost_split(tmp_path: Path) -> None:
    with pool_stack(tmp_path, ["--enable-prompt-tokens-details"], "{scrape_interval_s: 0.2}") as stack:

        async def traffic(rounds: int) -> None:
            for round_ in range(rounds):
                for tenant in TENANTS[:3]:
                    async with stack.client(tenant) as client:
                        await ask(client, tenant, f"question {round_}")

        asyncio.run(traffic(3))
        wait_for("hit rates scraped", lambda: any(r["prefix_hit_rate"] for r in stack.pool_view()["replicas"]))
        wait_for("three tenants homed", lambda: sum(len(r["home_tenants"]) for r in stack.pool_view()["replicas"]) == 3)
        wait_for("the ledger has booked the traffic", lambda: len(stack.attempts()) == 9)

        today = time.strftime("%Y-%m-%d", time.gmtime())
        response = stack.admin(f"/admin/pool?since={today}")
        assert response.status_code == 200
        [view] = response.json()["pools"]
        assert view["upstream"] == "pool" and len(view["replicas"]) == 3
        for replica in view["replicas"]:
            assert replica["healthy"] is True and replica["draining"] is False and replica["in_flight"] == 0
            assert replica["running"] >= 0 and replica["waiting"] >= 0 and 0 <= replica["kv_cache_usage"] <= 1
        homes = [t for r in view["replicas"] for t in r["home_tenants"]]
        assert sorted(homes) == TENANTS[:3], "each tenant's prefix has one home replica"
        served = {t for r in view["replicas"] for t in r["recent_tenants"]}
        assert served == set(TENANTS[:3]), "which tenants each replica served lately"
        costs = view["costs"]
        shares = sum(Decimal(t["share_usd"]) for t in costs["tenants"])
        assert Decimal(costs["cost_usd"]) > 0 and shares + Decimal(costs["idle_usd"]) == Decimal(costs["cost_usd"])
        assert {t["tenant"] for t in costs["tenants"]} >= set(TENANTS[:3])

        assert httpx.get(stack.gateway.removesuffix("/v1") + "/admin/pool", timeout=5).status_code == 401
        assert stack.admin("/admin/pool?since=yesterday").status_code == 400
