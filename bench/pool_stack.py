"""For bench/pool.py: a pool of vLLM simulator replicas and gateways in front of it, as
real processes on loopback ports, each stopped by the caller's ExitStack."""

from __future__ import annotations

import http.client
import os
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from bench import procs
from bench.gwstack import READY_TIMEOUT_S, get_json
from gateway.upstreams.pool_metrics import ReplicaMetrics, parse_replica_metrics

MODEL = "pool-model"
PRICE = {"input": 0.05, "cached_input": 0.01, "output": 0.20}  # USD per 1M tokens


def start_replicas(count: int, sim_flags: Sequence[str], workdir: Path, exits: ExitStack) -> list[int]:
    """`count` vLLM simulators (`gateway sim vllm`); their ports, once each answers /health."""
    spawned = []
    for i in range(count):
        port = procs.free_port()
        argv = [sys.executable, "-m", "gateway", "sim", "vllm", "--host", "127.0.0.1", "--port", str(port), "--model", MODEL,
                *sim_flags]
        proc = procs.Spawned(f"replica-{i}", argv, dict(os.environ), workdir, None)
        exits.callback(proc.stop)
        spawned.append((proc, port))
    for proc, port in spawned:
        procs.wait_until(proc, port, "GET", "/health", READY_TIMEOUT_S)
    return [port for _, port in spawned]


def pool_policy(replica_ports: Sequence[int], digests: dict[str, str]) -> dict[str, Any]:
    """One vLLM pool upstream with the pool settings left at their defaults (what is
    measured is the design, not a tuning), one model on it, a key per tenant."""
    return {
        "version": 1,
        "defaults": {"request_timeout_s": 60},
        "upstreams": {"pool": {"kind": "vllm", "replicas": [f"http://127.0.0.1:{p}/v1" for p in replica_ports]}},
        "models": {MODEL: {"upstream": "pool", "price": dict(PRICE)}},
        "tenants": {tenant: {"api_keys": [digest]} for tenant, digest in digests.items()},
    }


def start_gateways(count: int, policy: dict[str, Any], env: dict[str, str], workdir: Path, exits: ExitStack,
                   tag: str) -> list[int]:
    """`count` gateway processes on one policy; `env`: GATEWAY_SECRET (the same salts on
    every one), and REDIS_URL with a prefix of their own when they share homes."""
    path = workdir / f"policy-{tag}.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "GATEWAY_POLICY")}
    spawned = []
    for i in range(count):
        port = procs.free_port()
        proc_env = base | env | {"GATEWAY_VAR_DIR": str(workdir / f"var-{tag}-{i}")}
        argv = [sys.executable, "-m", "gateway", "serve", "--policy", str(path), "--host", "127.0.0.1", "--port", str(port)]
        proc = procs.Spawned(f"gateway-{tag}-{i}", argv, proc_env, workdir, None)
        exits.callback(proc.stop)
        spawned.append((proc, port))
    for proc, port in spawned:
        procs.wait_until(proc, port, "GET", "/healthz", READY_TIMEOUT_S)
    return [port for _, port in spawned]


def wait_for_scrapes(port: int, admin_key: str, replicas: int, timeout_s: float = 20.0) -> None:
    """Until the gateway has read every replica's /metrics (its KV size, block size)."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = get_json(port, "/admin/pool", {"Authorization": f"Bearer {admin_key}"})
        seen = [r for p in view["pools"] for r in p["replicas"] if r["metrics_age_s"] is not None]
        if len(seen) >= replicas:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"gateway on :{port} scraped {len(seen)} of {replicas} replicas in {timeout_s:.0f}s")
        time.sleep(0.1)


def replica_metrics(port: int) -> ReplicaMetrics:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10.0)
    try:
        conn.request("GET", "/metrics")
        return parse_replica_metrics(conn.getresponse().read().decode())
    finally:
        conn.close()


def reset_replica(port: int) -> None:
    """Empty prefix cache, counters from zero: each arm starts from the same state."""
    if procs.http_status(port, "POST", "/sim/reset") != 200:
        raise RuntimeError(f"replica on :{port} refused /sim/reset")
