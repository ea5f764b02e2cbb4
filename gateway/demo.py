"""`gateway demo`: the simulators and a gateway in one process, on local ports, with a
key for the application and one for finance - everything a new user needs to try the
gateway with no keys or services.

What it generates is kept under var/demo/ (gateway/demo_files.py) and reused on the next
start: the keys, the simulators' usage reports (so reconciliation still matches the
ledger after a restart) and the policy, which is the user's to edit: a restart keeps
the edits, changing only the simulator ports if they moved."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from gateway.app import GatewayApp, create_app
from gateway.auth.keys import key_digest, new_api_key
from gateway.demo_files import DemoFiles, write_private
from gateway.routing.loader import PolicyInvalid, load_policy_file
from gateway.serving.protocol import BoundedHttpProtocol
from gateway.settings import Settings
from gateway.sim.anthropic import create_anthropic_app
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from gateway.sim.vllm import VllmSimConfig, create_vllm_app

TEMPLATE = Path(__file__).resolve().parent.parent / "policies" / "demo.yaml"
PLACEHOLDER = re.compile(r"sha256:0{64}")
TEMPLATE_PORTS = {"hosted": 9100, "vllm": 9200, "anthropic": 9300}
CLAUDE_MODEL = "claude-small"  # the demo policy's model on Claude's simulator
# The demo policy's `api_key_env`s, and the keys the simulators are given.
SIMULATOR_KEYS = {"DEMO_HOSTED_API_KEY": "sk-sim-demo", "DEMO_ANTHROPIC_API_KEY": "sk-ant-sim-demo",
                  "DEMO_ANTHROPIC_ADMIN_KEY": "sk-ant-admin-sim-demo"}


@dataclass(frozen=True, slots=True)
class Demo:
    files: DemoFiles
    key: str
    admin_key: str
    notes: list[str]


def _kept_secret(path: Path, make: str) -> str:
    if path.exists():
        return path.read_text().strip()
    write_private(path, make + "\n")
    return make


def prepare_demo(var_dir: Path, ports: dict[str, int]) -> Demo:
    """The demo's files, made on the first start and kept after. `ports`: where each
    simulator of TEMPLATE_PORTS listens."""
    files = DemoFiles.under(var_dir)
    files.folder.mkdir(parents=True, exist_ok=True)
    key = _kept_secret(files.api_key, new_api_key())
    admin = os.environ.get("GATEWAY_ADMIN_KEY") or _kept_secret(files.admin_key, "sk-admin-" + secrets.token_urlsafe(24))
    provider_keys = files.read_provider_keys()
    for name, default in SIMULATOR_KEYS.items():
        provider_keys[name] = os.environ.get(name) or provider_keys.get(name) or default
    files.write_provider_keys(provider_keys)
    notes = _write_policy(files, key, ports)
    files.write_ports(ports)
    return Demo(files, key, admin, notes)


def _write_policy(files: DemoFiles, key: str, ports: dict[str, int]) -> list[str]:
    if not files.policy.exists():
        text = PLACEHOLDER.sub(key_digest(key), TEMPLATE.read_text())
        files.policy.write_text(_moved(text, TEMPLATE_PORTS, ports))
        return [f"wrote {files.policy} from {TEMPLATE.name}"]
    notes = [f"kept your {files.policy} (delete it to start again from {TEMPLATE.name})"]
    text = files.policy.read_text()
    moved = _moved(text, {**TEMPLATE_PORTS, **files.read_ports()}, ports)
    if moved != text:
        files.policy.write_text(moved)
        notes.append("changed only the simulators' ports in it, to the ones this demo listens on")
    if key_digest(key) not in moved:
        notes.append(f"note: it does not list the demo key's digest; add \"{key_digest(key)}\" to a tenant's api_keys")
    return notes


def _moved(text: str, before: dict[str, int], after: dict[str, int]) -> str:
    """`text` with each simulator's 127.0.0.1 address on its new port (all at once, so
    two ports that trade places do not clash)."""
    renames = {str(before[name]): str(after[name]) for name in after if name in before and before[name] != after[name]}
    if not renames:
        return text
    pattern = re.compile(r"127\.0\.0\.1:(" + "|".join(map(re.escape, renames)) + r")\b")
    return pattern.sub(lambda m: f"127.0.0.1:{renames[m.group(1)]}", text)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _claude_lines(root: str, key: str, served: bool) -> str:
    """The anthropic SDK snippet and the Claude Code line, when the policy serves the
    model they name (a policy kept from an older demo may not)."""
    if not served:
        return f"""
    (your policy has no `{CLAUDE_MODEL}`: delete it to get the current demo policy, with Claude's simulator)
"""
    return f"""
    from anthropic import Anthropic
    claude = Anthropic(base_url="{root}", api_key="{key}")
    reply = claude.messages.create(model="{CLAUDE_MODEL}", max_tokens=256, messages=[{{"role": "user", "content": "Hello"}}])
    print(reply.content[0].text, reply.usage)

Claude Code through the gateway:
    ANTHROPIC_BASE_URL={root} ANTHROPIC_API_KEY={key} \\
    ANTHROPIC_MODEL={CLAUDE_MODEL} ANTHROPIC_DEFAULT_HAIKU_MODEL={CLAUDE_MODEL} claude
"""


def _banner(port: int, demo: Demo, serves_claude: bool) -> str:
    root = f"http://127.0.0.1:{port}"
    base = f"{root}/v1"
    notes = "".join(f"  ({note})\n" for note in demo.notes)
    return f"""
Gateway demo is running.
  base URL : {base}
  API key  : {demo.key}
  policy   : {demo.files.policy}   (edit it: changes go live without a restart, and a restart keeps them)
{notes}  metrics  : http://127.0.0.1:{port}/metrics

Finance dashboard:
  address  : http://127.0.0.1:{port}/ui/
  admin key: {demo.admin_key}   (sign in with it; also the bearer key of /admin/*; kept in {demo.files.admin_key})

Try it:
    from openai import OpenAI
    client = OpenAI(base_url="{base}", api_key="{demo.key}")
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=[{{"role": "user", "content": "Hello"}}])
    print(reply.choices[0].message.content, reply.usage)
{_claude_lines(root, demo.key, serves_claude)}
Reports, from this folder in another terminal (`python3 run.py ...` in the repository):
    gateway reconcile          # the ledger against the simulators' usage reports, this month
    gateway routes report      # escalations and cost per successful request, per route

Press Ctrl-C to stop.
"""


async def _serve_all(servers: list[uvicorn.Server], banner: str) -> None:
    """Serve them all, each once the ones before it listen (the simulators before the
    gateway, so its pool finds its replicas up); the banner is printed once every one of
    them listens, so what it tells a user (or a script reading it) to call answers at once."""
    running: list[asyncio.Task[None]] = []
    for server in servers:
        running.append(asyncio.create_task(server.serve()))
        while not server.started:
            if any(task.done() for task in running):  # one could not start: it has said why
                await asyncio.gather(*running)
                return
            await asyncio.sleep(0.01)
    print(banner, flush=True)
    await asyncio.gather(*running)


def run_demo(args: argparse.Namespace) -> int:
    ports = {"hosted": args.hosted_port, "vllm": args.vllm_port, "anthropic": args.anthropic_port}
    for port in (args.port, *ports.values()):
        if not _port_free(port):
            print(f"error: port {port} is in use; pick others with --port/--hosted-port/--vllm-port/--anthropic-port")
            return 1
    var_dir = Path(os.environ.get("GATEWAY_VAR_DIR", "var"))
    demo = prepare_demo(var_dir, ports)
    try:
        policy = load_policy_file(demo.files.policy)
    except PolicyInvalid as exc:
        print(exc)
        print(f"error: fix {demo.files.policy}, or delete it to start again from {TEMPLATE.name}")
        return 1
    for name, value in demo.files.read_provider_keys().items():
        os.environ.setdefault(name, value)
    settings = Settings(gateway_policy=demo.files.policy, gateway_var_dir=var_dir, gateway_admin_key=demo.admin_key)

    def server(app: object, port: int) -> uvicorn.Server:
        # The gateway over uvicorn's protocol with bounds on the request head, as `gateway serve`.
        http = BoundedHttpProtocol if isinstance(app, GatewayApp) else "httptools"
        config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop", http=http,  # type: ignore[arg-type]
                                access_log=False, log_level="warning", timeout_keep_alive=75)
        return uvicorn.Server(config)

    servers = [
        server(create_hosted_app(HostedSimConfig(), demo.files.hosted_usage), ports["hosted"]),
        server(create_vllm_app(VllmSimConfig()), ports["vllm"]),
        server(create_anthropic_app(usage_journal=demo.files.anthropic_usage), ports["anthropic"]),
        server(create_app(settings), args.port),
    ]
    try:
        asyncio.run(_serve_all(servers, _banner(args.port, demo, CLAUDE_MODEL in policy.models)))
    except KeyboardInterrupt:
        pass
    return 0
