"""`gateway demo`: both simulators and a gateway in one process, on local ports, with a
fresh key - everything a new user needs to try the gateway with no keys or services."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
from pathlib import Path

import uvicorn

from gateway.app import GatewayApp, create_app
from gateway.auth.keys import key_digest, new_api_key
from gateway.serving.protocol import BoundedHttpProtocol
from gateway.settings import Settings
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from gateway.sim.vllm import VllmSimConfig, create_vllm_app

TEMPLATE = Path(__file__).resolve().parent.parent / "policies" / "demo.yaml"
PLACEHOLDER = re.compile(r"sha256:0{64}")


def write_demo_policy(var_dir: Path, hosted_port: int, vllm_port: int) -> tuple[Path, str]:
    demo_dir = var_dir / "demo"
    demo_dir.mkdir(parents=True, exist_ok=True)
    key_file = demo_dir / "api-key"
    key = key_file.read_text().strip() if key_file.exists() else new_api_key()
    key_file.write_text(key + "\n")
    text = TEMPLATE.read_text()
    text = PLACEHOLDER.sub(key_digest(key), text)
    text = text.replace("127.0.0.1:9100", f"127.0.0.1:{hosted_port}").replace("127.0.0.1:9200", f"127.0.0.1:{vllm_port}")
    policy = demo_dir / "policy.yaml"
    policy.write_text(text)
    return policy, key


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _banner(port: int, key: str, policy: Path) -> str:
    base = f"http://127.0.0.1:{port}/v1"
    return f"""
Gateway demo is running.
  base URL : {base}
  API key  : {key}
  policy   : {policy}   (edit it: changes go live without a restart)
  metrics  : http://127.0.0.1:{port}/metrics

Try it:
    from openai import OpenAI
    client = OpenAI(base_url="{base}", api_key="{key}")
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=[{{"role": "user", "content": "Hello"}}])
    print(reply.choices[0].message.content, reply.usage)

Press Ctrl-C to stop.
"""


async def _serve_all(servers: list[uvicorn.Server]) -> None:
    await asyncio.gather(*(s.serve() for s in servers))


def run_demo(args: argparse.Namespace) -> int:
    for port in (args.port, args.hosted_port, args.vllm_port):
        if not _port_free(port):
            print(f"error: port {port} is in use; pick others with --port/--hosted-port/--vllm-port")
            return 1
    var_dir = Path(os.environ.get("GATEWAY_VAR_DIR", "var"))
    policy, key = write_demo_policy(var_dir, args.hosted_port, args.vllm_port)
    os.environ.setdefault("DEMO_HOSTED_API_KEY", "sk-sim-demo")
    settings = Settings(gateway_policy=policy, gateway_var_dir=var_dir)

    def server(app: object, port: int) -> uvicorn.Server:
        # The gateway over its own HTTP/1.1 protocol, as `gateway serve`; the simulators over uvicorn's.
        http = BoundedHttpProtocol if isinstance(app, GatewayApp) else "httptools"
        config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop", http=http,  # type: ignore[arg-type]
                                access_log=False, log_level="warning", timeout_keep_alive=75)
        return uvicorn.Server(config)

    servers = [
        server(create_hosted_app(HostedSimConfig()), args.hosted_port),
        server(create_vllm_app(VllmSimConfig()), args.vllm_port),
        server(create_app(settings), args.port),
    ]
    print(_banner(args.port, key, policy), flush=True)
    try:
        asyncio.run(_serve_all(servers))
    except KeyboardInterrupt:
        pass
    return 0
