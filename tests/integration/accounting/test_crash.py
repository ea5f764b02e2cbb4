"""SIGKILL a gateway under load, restart it and sweep: every request the provider
billed is in the ledger, and no hold is left open - a hold made ahead of demand
included, charged as unconfirmed with a reason that says what it was."""

from __future__ import annotations

import asyncio
import contextlib
import os
import textwrap
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import Engine, create_engine, text

from gateway.auth.keys import key_digest, new_api_key
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from tests.support.processes import GatewayProcess
from tests.support.servers import run_asgi_in_thread

ADMIN = "crash-admin-key"
UPSTREAM_KEY = "sk-crash-upstream"


def write_policy(path: Path, hosted: str, key: str) -> None:
    path.write_text(textwrap.dedent(f"""\
        version: 1
        defaults:
          request_timeout_s: 3
          reservation_grace_s: 0
          hold_ahead_s: 1         # the hold made ahead that the kill leaves open expires 1 s after the others
        upstreams:
          hosted: {{kind: openai, base_url: "{hosted}/v1", api_key_env: CRASH_UPSTREAM_KEY}}
        models:
          gpt-4o-mini: {{upstream: hosted, price: {{input: 0.15, cached_input: 0.075, output: 0.60}}}}
        tenants:
          acme:
            api_keys: ["{key_digest(key)}"]
            budget: {{usd: "50.00", period: month}}
        """))


async def load(url: str, key: str, billed_enough: Callable[[], bool], proc: GatewayProcess) -> int:
    """Keep 24 requests in flight (half streamed); once the provider has billed some,
    kill the gateway while others are still mid-way."""
    sent = 0

    async def worker(i: int, client: httpx.AsyncClient) -> None:
        nonlocal sent
        while True:
            sent += 1
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"job {i}-{sent}"}], "stream": i % 2 == 0}
            with contextlib.suppress(httpx.HTTPError):
                async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                                         headers={"authorization": f"Bearer {key}"}) as r:
                    async for _ in r.aiter_raw():
                        pass

    async with httpx.AsyncClient(timeout=10) as client:
        workers = [asyncio.create_task(worker(i, client)) for i in range(24)]
        deadline = time.monotonic() + 30
        while not billed_enough():
            assert time.monotonic() < deadline, "the provider never billed anything"
            await asyncio.sleep(0.01)
        proc.kill()
        await asyncio.sleep(0.2)
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return sent


def test_sigkill_under_load_loses_no_billed_request(tmp_path: Path) -> None:
    key = new_api_key()
    os.environ["CRASH_UPSTREAM_KEY"] = UPSTREAM_KEY
    sim = create_hosted_app(HostedSimConfig(token_delay_s=0.02, output_tokens=20))
    with run_asgi_in_thread(sim) as hosted:
        policy = tmp_path / "policy.yaml"
        write_policy(policy, hosted, key)
        db = f"sqlite:///{tmp_path / 'ledger.db'}"
        env = {"DATABASE_URL": db, "GATEWAY_ADMIN_KEY": ADMIN, "GATEWAY_VAR_DIR": str(tmp_path / "var"),
               "GATEWAY_SWEEP_INTERVAL_S": "3600"}
        proc = GatewayProcess(policy, env, tmp_path / "gateway.log")
        proc.start()
        asyncio.run(load(proc.url, key, lambda: len(sim.usage.records) >= 30, proc))

        deadline = time.monotonic() + 10
        while sim.stats.active_streams:  # let the provider finish what it was doing
            assert time.monotonic() < deadline
            time.sleep(0.02)
        billed = {r.request_id for r in sim.usage.records}
        assert billed, "the load should have produced billed requests"

        restarted = GatewayProcess(policy, env, tmp_path / "gateway-2.log")
        restarted.start()
        try:
            engine = create_engine(db)
            deadline = time.monotonic() + 20
            while True:
                httpx.post(f"{restarted.url}/admin/sweep", headers={"authorization": f"Bearer {ADMIN}"}).raise_for_status()
                with engine.connect() as conn:
                    still_open = conn.execute(text("SELECT count(*) FROM reservations WHERE state = 'reserved'")).scalar_one()
                if still_open == 0:
                    break
                assert time.monotonic() < deadline, "the sweeper should end every orphaned hold once it expires"
                time.sleep(0.2)
            with engine.connect() as conn:
                confirmed = {r[0] for r in conn.execute(text(
                    "SELECT provider_request_id FROM usage_events WHERE status = 'ok'")).all()}
                unconfirmed = conn.execute(text("SELECT count(*) FROM usage_events WHERE status = 'unconfirmed'")).scalar_one()
                reserved = conn.execute(text("SELECT sum(reserved_pico) FROM budgets")).scalar_one()
            engine.dispose()
            report = httpx.get(f"{restarted.url}/admin/reconcile", headers={"authorization": f"Bearer {ADMIN}"},
                               params={"provider": "hosted", "since": datetime.now(UTC).date().isoformat()}, timeout=30)
            assert report.status_code == 200, report.text
        finally:
            restarted.stop()

    assert confirmed <= billed, "the ledger confirms only what the provider billed"
    missing = billed - confirmed
    assert missing, "a SIGKILL mid-load should leave some billed requests unconfirmed"
    assert unconfirmed >= len(missing), f"{len(missing)} billed requests have no ledger row (only {unconfirmed} unconfirmed)"
    assert reserved == 0
    # Reconciliation against the provider's own usage report explains every difference
    # by what the crash did - nothing is simply missing on either side.
    rows = report.json()["rows"]
    assert rows
    for row in rows:
        reasons = {r["reason"] for r in row["reasons"]}
        assert reasons <= {"unconfirmed", "pending", "cancelled", "retried"}, row
        explained = sum(r["requests"] for r in row["reasons"])
        assert explained == row["difference"]["requests"], row
    assert any(row["reasons"] for row in rows), "the killed requests must show up as explained differences"


def open_holds(engine: Engine, ahead: bool) -> int:
    made_ahead = "substr(request_id, 1, 6) = 'ahead_'"
    where = made_ahead if ahead else f"NOT {made_ahead}"
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM reservations WHERE state = 'reserved' AND {where}")).scalar_one())


def test_sigkill_with_a_hold_made_ahead_expires_it_as_unconfirmed_and_says_why(tmp_path: Path) -> None:
    key = new_api_key()
    os.environ["CRASH_UPSTREAM_KEY"] = UPSTREAM_KEY
    with run_asgi_in_thread(create_hosted_app(HostedSimConfig(output_tokens=5))) as hosted:
        policy = tmp_path / "policy.yaml"
        write_policy(policy, hosted, key)
        db = f"sqlite:///{tmp_path / 'ledger.db'}"
        env = {"DATABASE_URL": db, "GATEWAY_ADMIN_KEY": ADMIN, "GATEWAY_VAR_DIR": str(tmp_path / "var"),
               "GATEWAY_SWEEP_INTERVAL_S": "3600"}
        engine = create_engine(db)
        proc = GatewayProcess(policy, env, tmp_path / "gateway.log")
        proc.start()
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "one"}]}
        answer = httpx.post(f"{proc.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=10)
        assert answer.status_code == 200, answer.text
        deadline = time.monotonic() + 10
        # Killed once the answered call is booked and a hold for this key's next call is in.
        while open_holds(engine, ahead=False) or open_holds(engine, ahead=True) == 0:
            assert time.monotonic() < deadline, "a hold should have been made ahead of the next request"
            time.sleep(0.02)
        proc.kill()

        restarted = GatewayProcess(policy, env, tmp_path / "gateway-2.log")
        restarted.start()
        try:
            deadline = time.monotonic() + 20
            while open_holds(engine, ahead=True):
                httpx.post(f"{restarted.url}/admin/sweep", headers={"authorization": f"Bearer {ADMIN}"}).raise_for_status()
                assert time.monotonic() < deadline, "the sweeper should expire the hold made ahead"
                time.sleep(0.2)
            with engine.connect() as conn:
                [(cost, error)] = conn.execute(text(
                    "SELECT cost_pico, error FROM usage_events WHERE status = 'unconfirmed'")).all()
                [(held,)] = conn.execute(text("SELECT amount_pico FROM reservations WHERE state = 'expired'")).all()
                reserved = conn.execute(text("SELECT sum(reserved_pico) FROM budgets")).scalar_one()
            report = httpx.get(f"{restarted.url}/admin/reconcile", headers={"authorization": f"Bearer {ADMIN}"},
                               params={"provider": "hosted", "since": datetime.now(UTC).date().isoformat()}, timeout=30)
            assert report.status_code == 200, report.text
        finally:
            restarted.stop()
            engine.dispose()

    assert "held ahead of demand" in error and cost == held > 0, "charged its worst case, with the reason"
    assert reserved == 0
    [row] = report.json()["rows"]
    assert {r["reason"] for r in row["reasons"]} == {"unconfirmed"}, row
