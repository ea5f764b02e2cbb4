"""The proxies bench/compare.py measures, each started on the gateway's core
(bench/placement.py) in front of the simulator.

- ours: `python -m gateway serve` with bench/overhead.py's policy (one tenant with a budget,
  so the durable reservation is on the path), 1 worker.
- litellm: the LiteLLM proxy pinned by bench/litellm_venv.py, `--num_workers 1`, no database,
  no master key unless asked, offline cost map.
- portkey: the Portkey AI gateway (Node.js) pinned by bench/portkey_install.py, headless, told
  the upstream per request (`x-portkey-provider: openai`, `x-portkey-custom-host`).
- vllm-router: the Rust router pinned by bench/vllm_router_venv.py, the simulator as its one
  worker; it forwards the client's headers (the simulator's key included) as they come.
- passthrough: bench/passthrough.py, a forwarder on the gateway's own server and client
  that does nothing else: the floor any proxy on that stack sets on the machine at hand.

A `Proxy` is spawned by its constructor, which returns once the proxy has answered its
readiness path and a first chat completion with 200 (both timed from spawn).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import litellm_venv, placement, portkey_install, procs, vllm_router_venv
from bench.loadgen import Target
from bench.overhead import CHAT_PATH, POLICY, READY_TIMEOUT_S, SIM_KEY
from bench.placement import Placement
from bench.workload import chat_body
from gateway.auth.keys import key_digest, new_api_key

PEERS = ("ours", "litellm", "portkey", "vllm-router", "passthrough")
LITELLM_READY_TIMEOUT_S = 180.0  # first import of litellm[proxy] is slow
LITELLM_CONFIG = """\
model_list:
  - model_name: bench-model
    litellm_params:
      model: openai/bench-model
      api_base: http://127.0.0.1:{sim_port}/v1
      api_key: {sim_key}
litellm_settings:
  telemetry: false
  drop_params: true
  set_verbose: false
  json_logs: false
general_settings:
  disable_spend_logs: true
  disable_reset_budget: true
"""
# Portkey's server (@hono/node-server) listens on every interface and has no host option;
# this preload binds any listen(port) without a host to 127.0.0.1 instead.
PORTKEY_LOCALHOST_JS = """\
const net = require("node:net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" && typeof args[1] !== "string") args.splice(1, 0, "127.0.0.1");
  return listen.apply(this, args);
};
"""
VLLM_ROUTER_POLICIES = ("round_robin", "random", "cache_aware", "consistent_hash")
VLLM_ROUTER_STARTUP_TIMEOUT_S = 60


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--litellm-master-key",
        action="store_true",
        help="run LiteLLM with a random master key (auth on the path, like ours) instead of none",
    )
    parser.add_argument("--litellm-venv", type=Path, default=litellm_venv.VENV_DIR, help="venv for the LiteLLM proxy")
    parser.add_argument("--portkey-dir", type=Path, default=portkey_install.INSTALL_DIR, help="npm ci folder for Portkey")
    parser.add_argument("--vllm-router-venv", type=Path, default=vllm_router_venv.VENV_DIR, help="venv for vllm-router")
    parser.add_argument(
        "--vllm-router-policy",
        choices=VLLM_ROUTER_POLICIES,
        default="round_robin",
        help="vllm-router --policy (default round_robin; its own default cache_aware also POSTs"
        " /v1/chat/completions/render to the worker before every request)",
    )


def install(args: argparse.Namespace) -> tuple[dict[str, Path], dict[str, str | None]]:
    """Install (or reuse) every requested peer: its executable or entry point, and versions."""
    paths: dict[str, Path] = {}
    versions: dict[str, str | None] = {}
    if "litellm" in args.proxies:
        paths["litellm"] = litellm_venv.ensure(venv_dir=args.litellm_venv)
        versions["litellm"] = litellm_venv.installed_version(args.litellm_venv)
    if "portkey" in args.proxies:
        paths["portkey"] = portkey_install.ensure(install_dir=args.portkey_dir)
        versions["portkey"] = portkey_install.installed_version(args.portkey_dir)
        versions["node"] = portkey_install.node_version()
    if "vllm-router" in args.proxies:
        paths["vllm-router"] = vllm_router_venv.ensure(venv_dir=args.vllm_router_venv)
        versions["vllm-router"] = vllm_router_venv.installed_version(args.vllm_router_venv)
    return paths, versions


class Proxy:
    """One proxy under test on the gateway's core; `stop()` ends it (also registered on the ExitStack)."""

    name: str
    api_key: str
    ready_path: str
    ready_timeout_s = READY_TIMEOUT_S
    extra_headers: tuple[tuple[str, str], ...] = ()

    def __init__(self, sim_port: int, workdir: Path, exits: ExitStack, place: Placement | None) -> None:
        self.sim_port, self.workdir, self.place = sim_port, workdir, place
        self.port = procs.free_port()
        self.argv, env = self.command()
        self.proc = procs.Spawned(self.name, self.argv, env, workdir, placement.gateway_core(place))
        exits.callback(self.proc.stop)
        timeout = self.ready_timeout_s
        ready_s = procs.wait_until(self.proc, self.port, "GET", self.ready_path, timeout)
        first_s = procs.wait_until(
            self.proc, self.port, "POST", CHAT_PATH, timeout, body=chat_body(False), headers=self.target(False).headers()
        )
        self.startup = {"ready_path": self.ready_path, "ready_s": round(ready_s, 3), "first_chat_200_s": round(first_s, 3)}

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def target(self, stream: bool) -> Target:
        return Target(self.name, self.port, CHAT_PATH, self.api_key, stream, chat_body(stream), self.extra_headers)

    def memory(self) -> dict[str, int]:
        return {"rss_kib": procs.memory_kib(self.proc.pid), "hwm_kib": procs.memory_kib(self.proc.pid, "VmHWM")}

    def stop(self) -> None:
        self.proc.stop()


class OurGateway(Proxy):
    name, ready_path = "ours", "/healthz"

    def __init__(self, sim_port: int, workdir: Path, exits: ExitStack, place: Placement | None) -> None:
        self.api_key = new_api_key()
        super().__init__(sim_port, workdir, exits, place)

    def command(self) -> tuple[list[str], dict[str, str]]:
        policy = self.workdir / "policy.yaml"
        policy.write_text(POLICY.format(sim_port=self.sim_port, digest=key_digest(self.api_key)))
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "GATEWAY_POLICY")}
        env |= {"GATEWAY_VAR_DIR": str(self.workdir / "var"), "BENCH_SIM_API_KEY": SIM_KEY}
        argv = [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--policy",
            str(policy),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        return argv, env


class LiteLLM(Proxy):
    name, ready_path = "litellm", "/health/liveliness"
    ready_timeout_s = LITELLM_READY_TIMEOUT_S

    def __init__(self, litellm_bin: Path, master_key: bool, sim_port: int, workdir: Path, exits: ExitStack, place: Placement | None) -> None:
        self.litellm_bin, self.master_key = litellm_bin, master_key
        # Without a master key the proxy checks no key at all; with one, only that key is accepted.
        self.api_key = "sk-" + secrets.token_hex(32) if master_key else "sk-anything"
        super().__init__(sim_port, workdir, exits, place)

    def command(self) -> tuple[list[str], dict[str, str]]:
        config = self.workdir / "litellm.yaml"
        config.write_text(LITELLM_CONFIG.format(sim_port=self.sim_port, sim_key=SIM_KEY))
        env = litellm_venv.runtime_env()
        env.pop("VIRTUAL_ENV", None)
        if self.master_key:
            env["LITELLM_MASTER_KEY"] = self.api_key
        else:
            # 1.108.x refuses to boot without a master key (UnsafeMasterKeyError); this is its
            # documented local-development override. Everything listens on 127.0.0.1 only.
            env["LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY"] = "true"
        env["PATH"] = f"{self.litellm_bin.parent}:{env.get('PATH', '')}"
        argv = [
            str(self.litellm_bin),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--num_workers",
            "1",
        ]
        return argv, env


class Portkey(Proxy):
    """Open-source Portkey has no client keys of its own: the client sends the provider's key
    (here the simulator's) and names the provider and upstream in headers."""

    name, ready_path = "portkey", "/"

    def __init__(self, entry: Path, sim_port: int, workdir: Path, exits: ExitStack, place: Placement | None) -> None:
        self.entry, self.api_key = entry, SIM_KEY
        self.extra_headers = (
            ("x-portkey-provider", "openai"),
            ("x-portkey-custom-host", f"http://127.0.0.1:{sim_port}/v1"),
        )
        super().__init__(sim_port, workdir, exits, place)

    def command(self) -> tuple[list[str], dict[str, str]]:
        preload = self.workdir / "portkey-localhost.cjs"
        preload.write_text(PORTKEY_LOCALHOST_JS)
        # `--port=N` is the only form it parses; `--headless` (and NODE_ENV=production) turn off
        # the web UI and its /log/stream of every request.
        argv = [portkey_install.tool("node"), "--require", str(preload), str(self.entry), f"--port={self.port}", "--headless"]
        return argv, portkey_install.runtime_env()


class VllmRouter(Proxy):
    """Routing only: no client keys, the client's Authorization header goes to the worker as is."""

    name, ready_path = "vllm-router", "/liveness"

    def __init__(self, router_bin: Path, policy: str, sim_port: int, workdir: Path, exits: ExitStack, place: Placement | None) -> None:
        self.router_bin, self.policy, self.api_key = router_bin, policy, SIM_KEY
        status = procs.http_status(sim_port, "GET", "/health")
        if status is None or not 200 <= status < 300:
            raise RuntimeError(
                f"the simulator answers {status} to GET /health. vllm-router polls GET <worker>/health at start-up"
                " until it gets a 2xx (the path is fixed: --health-check-endpoint only sets the periodic check), so it"
                f" would wait {VLLM_ROUTER_STARTUP_TIMEOUT_S} s and exit; the hosted simulator needs a GET /health route"
            )
        super().__init__(sim_port, workdir, exits, place)

    def command(self) -> tuple[list[str], dict[str, str]]:
        argv = [
            str(self.router_bin),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--worker-urls", f"http://127.0.0.1:{self.sim_port}",
            "--policy", self.policy,
            "--health-check-endpoint", "/v1/models",  # the periodic check (every 60 s), on a path the simulator has
            "--worker-startup-timeout-secs", str(VLLM_ROUTER_STARTUP_TIMEOUT_S),
            "--worker-startup-check-interval", "1",  # default 30 s between start-up probes
            "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(procs.free_port()),  # cannot be turned off; default port 29000
            "--log-level", "warning",
        ]  # fmt: skip
        return argv, vllm_router_venv.runtime_env()


class Passthrough(Proxy):
    """No keys of its own: the client's Authorization (the simulator's key) goes on as is."""

    name, ready_path = "passthrough", "/health"  # the simulator's own, forwarded

    def __init__(self, sim_port: int, workdir: Path, exits: ExitStack, place: Placement | None) -> None:
        self.api_key = SIM_KEY
        super().__init__(sim_port, workdir, exits, place)

    def command(self) -> tuple[list[str], dict[str, str]]:
        script = Path(__file__).resolve().parent / "passthrough.py"
        argv = [sys.executable, str(script), "--port", str(self.port), "--upstream", f"http://127.0.0.1:{self.sim_port}"]
        return argv, dict(os.environ)


def start(
    name: str, args: argparse.Namespace, paths: dict[str, Path], sim_port: int, workdir: Path, exits: ExitStack, place: Placement | None
) -> Proxy:
    """Spawn one peer and wait until it has answered a first chat completion."""
    rest: tuple[Any, ...] = (sim_port, workdir, exits, place)
    if name == "ours":
        return OurGateway(*rest)
    if name == "litellm":
        return LiteLLM(paths["litellm"], args.litellm_master_key, *rest)
    if name == "portkey":
        return Portkey(paths["portkey"], *rest)
    if name == "vllm-router":
        return VllmRouter(paths["vllm-router"], args.vllm_router_policy, *rest)
    if name == "passthrough":
        return Passthrough(*rest)
    raise ValueError(f"unknown proxy {name!r}; one of {', '.join(PEERS)}")
