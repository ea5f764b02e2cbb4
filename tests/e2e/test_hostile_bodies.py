"""Fuzzed bodies from a client with a valid key never make the gateway fail: every
request endpoint answers a hostile body with a 4xx that says what was wrong (or, for a
body that gets through, the model's answer or the upstream's own failure), never a 500."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.e2e.test_caching import ToolServer
from tests.support.hostile_json import Hostile, dump
from tests.support.servers import run_asgi_in_thread
from tests.support.stack import ADMIN_KEY, Stack, running_stack

REQUESTS = 2500
# Another seed explores other bodies: GATEWAY_FUZZ_SEED=7 pytest tests/e2e/test_hostile_bodies.py
SEED = int(os.environ.get("GATEWAY_FUZZ_SEED", "31"))
CONCURRENCY = 12
# Failures the upstream caused, which the gateway reports as such.
UPSTREAM_STATUSES = {502, 504}
NO_ANSWER = 0  # the connection closed without a response: as bad as a 500

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
CHAT_FIELDS = ["model", "messages", "messages.0", "messages.0.role", "messages.0.content", "messages.0.name",
               "messages.0.tool_calls", "stream", "stream_options", "stream_options.include_usage", "n", "max_tokens",
               "max_completion_tokens", "temperature", "top_p", "seed", "tools", "tool_choice", "response_format",
               "response_format.type", "response_format.json_schema", "logit_bias", "user", "stop", "metadata",
               "prompt_cache_key", "logprobs", "top_logprobs", "presence_penalty"]
COMPLETION = {"model": "gpt-4o-mini", "prompt": "once upon", "max_tokens": 8}
COMPLETION_FIELDS = ["model", "prompt", "max_tokens", "n", "stream", "echo", "suffix", "logprobs", "best_of", "temperature", "seed"]
EMBEDDING = {"model": "text-embedding-3-small", "input": "hello"}
EMBEDDING_FIELDS = ["model", "input", "encoding_format", "dimensions", "user"]
TASK = {"budget_usd": "1.00", "max_calls": 5, "max_tokens": 1000, "deadline_s": 60}
TASK_FIELDS = ["budget_usd", "max_calls", "max_tokens", "deadline_s", "metadata"]
INVOKE = {"arguments": {"q": "weather", "n": 1}}
INVOKE_FIELDS = ["arguments", "arguments.q", "arguments.n"]
MODELS = ["gpt-4o-mini", "auto", "pool-model", "sim-large", "text-embedding-3-small"]
HEADER_VALUES = ["", "0", "-1", "1e999", "NaN", "nan", "inf", "0.000001", "99999999999", "task_missing", "no-store",
                 "no-cache, no-store", "batch", "interactive", "x" * 2000, "caf\xe9"]
HEADERS = ["x-task-id", "x-request-timeout", "cache-control", "x-priority", "x-task-class"]


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    path: str  # under the gateway's root
    body: str | None
    headers: dict[str, str]

    def __str__(self) -> str:
        return f"{self.method} {self.path} {self.headers} {(self.body or '')[:300]!r}"


class Calls:
    def __init__(self, stack: Stack, seed: int, task: str) -> None:
        self.hostile = Hostile(seed)
        self.rng = self.hostile.rng
        self.tenant = {"authorization": f"Bearer {stack.key}"}
        self.admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        self.task = task  # calls made in it hold against its budget

    def next(self) -> Call:
        kind = self.rng.choice(["chat", "chat", "chat", "completions", "embeddings", "tasks", "tools", "admin"])
        if kind == "admin":
            return self.admin_call()
        template, fields, path = {
            "chat": (CHAT, CHAT_FIELDS, "/v1/chat/completions"),
            "completions": (COMPLETION, COMPLETION_FIELDS, "/v1/completions"),
            "embeddings": (EMBEDDING, EMBEDDING_FIELDS, "/v1/embeddings"),
            "tasks": (TASK, TASK_FIELDS, "/v1/tasks"),
            "tools": (INVOKE, INVOKE_FIELDS, f"/v1/tools/{self.rng.choice(['lookup', 'getter', 'lookup', 'nope'])}/invoke"),
        }[kind]
        body = dict(template)
        if "model" in body:
            body["model"] = self.rng.choice(MODELS)
        if kind in ("chat", "completions"):
            body["stream"] = self.rng.random() < 0.25
        headers = dict(self.tenant)
        if self.rng.random() < 0.3:
            headers["x-task-id"] = self.task
        if self.rng.random() < 0.2:
            headers[self.rng.choice(HEADERS)] = self.rng.choice(HEADER_VALUES)
        text = dump(self.hostile.mutate(body, fields))
        if self.rng.random() < 0.03:
            text = text[:self.rng.randrange(len(text))]  # cut short: not JSON at all
        return Call("POST", path, text, headers)

    def admin_call(self) -> Call:
        def text() -> str:
            value = self.hostile.value()
            return (value if isinstance(value, str) else dump(value))[:300]

        def query(*names: str) -> str:
            return "&".join(f"{name}={quote(text())}" for name in names if self.rng.random() < 0.7)

        body = dump(self.hostile.value()) if self.rng.random() < 0.5 else None
        method, path = self.rng.choice([
            ("GET", f"/admin/costs?{query('group_by', 'from', 'to', 'tenant', 'format')}"),
            ("GET", f"/admin/routes?{query('since')}"),
            ("GET", f"/admin/reconcile?{query('provider', 'since', 'until')}"),
            ("GET", "/admin/prompt-hygiene"),
            ("POST", "/admin/sweep"),
            ("DELETE", f"/admin/tools/{quote(text(), safe='')}/cache"),
            ("DELETE", "/admin/tools/lookup/cache"),
        ])
        return Call(method, path, body, dict(self.admin))


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with run_asgi_in_thread(ToolServer()) as tools:
        def edit(text: str) -> str:
            return text + (f"tools:\n  lookup:\n    url: {tools}/lookup\n    price_usd: 0.001\n"
                           f"  getter:\n    url: {tools}/get\n    method: GET\n")
        with running_stack(tmp_path, edit_policy=edit) as running:
            yield running


def test_fuzzed_bodies_get_4xx_never_5xx(stack: Stack) -> None:
    task = httpx.post(f"{stack.gateway}/tasks", json={"budget_usd": "1000"}, headers={"authorization": f"Bearer {stack.key}"})
    calls = Calls(stack, SEED, task.json()["id"])
    plan = [calls.next() for _ in range(REQUESTS)]
    root = stack.gateway.removesuffix("/v1")

    async def send(client: httpx.AsyncClient, gate: asyncio.Semaphore, call: Call) -> tuple[Call, int, Any]:
        async with gate:
            content = call.body.encode() if call.body is not None else None
            headers = {name: value.encode("latin-1") for name, value in {**call.headers, "content-type": "application/json"}.items()}
            try:
                r = await client.request(call.method, root + call.path, content=content, headers=headers)
            except httpx.TransportError as exc:
                return call, NO_ANSWER, repr(exc)
            try:
                return call, r.status_code, r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text
            except ValueError:
                return call, r.status_code, r.text

    async def run_all() -> list[tuple[Call, int, Any]]:
        gate = asyncio.Semaphore(CONCURRENCY)
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(send(client, gate, call) for call in plan))

    results = asyncio.run(run_all())
    failures = [f"{status} for {call}: {str(reply)[:300]}" for call, status, reply in results
                if status == NO_ANSWER or (status >= 500 and status not in UPSTREAM_STATUSES)]
    assert not failures, f"{len(failures)} of {REQUESTS} fuzzed requests failed in the gateway:\n" + "\n".join(failures[:20])
    shapeless = [f"{status} for {call}: {str(reply)[:300]}" for call, status, reply in results
                 if status >= 400 and not (isinstance(reply, dict) and isinstance(reply.get("error"), dict)
                                           and reply["error"].get("message"))]
    assert not shapeless, "every refusal says why, in OpenAI's error shape:\n" + "\n".join(shapeless[:20])
    statuses = {status for _, status, _ in results}
    assert 200 in statuses and 400 in statuses, f"the fuzz should reach both answers and refusals: {sorted(statuses)}"
