"""Rate limits hold across replicas sharing Redis, and overload is refused fast and
honestly while admitted requests keep bounded latency and memory stays flat."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from gateway.auth.keys import new_api_key
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from tests.support.policies import single_model_policy
from tests.support.processes import GatewayProcess, gateway_processes
from tests.support.servers import run_asgi_in_thread

RPM = 30


def write_policy(path: Path, hosted: str, key: str, max_queue: int, max_wait_s: float) -> None:
    limits = f"limits: {{rpm: {RPM}, max_queue: {max_queue}, max_wait_s: {max_wait_s}}}"
    path.write_text(single_model_policy(hosted, {"acme": (key, limits)}))


Result = tuple[int, float, httpx.Headers, str]


async def offer(urls: list[str], key: str, count: int, concurrency: int) -> list[Result]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=concurrency)) as client:
        async def one(i: int) -> Result:
            async with sem:
                start = time.monotonic()
                r = await client.post(f"{urls[i % len(urls)]}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                                      json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
                return r.status_code, time.monotonic() - start, r.headers, r.text
        return await asyncio.gather(*(one(i) for i in range(count)))


@pytest.mark.services
@pytest.mark.parametrize("replicas", [2, 3])
def test_replicas_sharing_redis_never_admit_more_than_the_limit(
    tmp_path: Path, redis_prefix: tuple[str, str], replicas: int
) -> None:
    key = new_api_key()
    with run_asgi_in_thread(create_hosted_app(HostedSimConfig())) as hosted:
        policy = tmp_path / "policy.yaml"
        write_policy(policy, hosted, key, max_queue=0, max_wait_s=0)
        env = {"REDIS_URL": redis_prefix[0], "GATEWAY_REDIS_PREFIX": redis_prefix[1], "GATEWAY_VAR_DIR": str(tmp_path / "var"),
               "DATABASE_URL": f"sqlite:///{tmp_path / 'ledger.db'}"}
        with gateway_processes(replicas, policy, env, tmp_path) as gateways:
            start = time.monotonic()
            results = asyncio.run(offer([g.url for g in gateways], key, 4 * RPM, concurrency=24))
            elapsed = time.monotonic() - start
    admitted = sum(1 for status, _, _, _ in results if status == 200)
    refill = int(elapsed * RPM / 60) + 1
    assert RPM <= admitted <= RPM + refill, f"{admitted} admitted by {replicas} replicas; the limit is {RPM} (+{refill} refill)"
    for status, _, headers, _ in results:
        if status != 200:
            assert status == 429 and int(headers["retry-after"]) >= 1
            assert headers["x-ratelimit-limit-requests"] == str(RPM)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_overload_is_refused_fast_and_memory_stays_flat(tmp_path: Path) -> None:
    key = new_api_key()
    max_wait_s = 2.0
    with run_asgi_in_thread(create_hosted_app(HostedSimConfig(latency_s=0.02))) as hosted:
        policy = tmp_path / "policy.yaml"
        write_policy(policy, hosted, key, max_queue=4, max_wait_s=max_wait_s)
        proc = GatewayProcess(policy, {"GATEWAY_VAR_DIR": str(tmp_path / "var")}, tmp_path / "gateway.log")
        proc.start()
        try:
            assert proc.proc is not None
            rounds = []
            for _ in range(3):  # each round offers 3x what the bucket holds
                rounds.append(asyncio.run(offer([proc.url], key, 3 * RPM, concurrency=30)))
                if len(rounds) == 2:
                    rss_after_warmup = rss_kb(proc.proc.pid)
            rss_after = rss_kb(proc.proc.pid)
        finally:
            proc.stop()
    everything = [r for round_ in rounds for r in round_]
    refused = [(t, body) for s, t, _, body in everything if s == 429]
    admitted = [t for s, t, _, _ in everything if s == 200]
    assert refused and admitted
    assert len(admitted) + len(refused) == len(everything), "overload gives 200 or 429, never errors"
    # With the wait queue full, a refusal comes at once rather than after a wait.
    queue_full = [t for t, body in refused if "queue_full" in body]
    assert queue_full, "offering 3x capacity should fill the wait queue"
    assert max(queue_full) < max_wait_s / 2, f"slowest queue-full refusal took {max(queue_full):.3f}s"
    # Nobody waits past max_wait_s: admitted or refused, each request's wait is bounded.
    slack = 1.5  # processing and a shared, noisy machine
    assert max(t for t, _ in refused) < max_wait_s + slack
    assert max(admitted) < max_wait_s + slack, f"slowest admitted request took {max(admitted):.3f}s"
    assert rss_after - rss_after_warmup < 8 * 1024, f"RSS grew {rss_after - rss_after_warmup} kB under repeated overload"
