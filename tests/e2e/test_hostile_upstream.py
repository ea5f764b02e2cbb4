"""The gateway (a real `gateway serve` process) in front of an upstream that misbehaves
on purpose, and clients that hang up: large answers come through whole from one call;
a head flood or an event that never ends is a 502 inside the deadline, with the
gateway still answering and its memory bounded; a client that leaves takes its call
with it, from the queue or from the upstream."""

from __future__ import annotations

import asyncio
import statistics
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from gateway.auth.keys import key_digest, new_api_key
from tests.support.processes import GatewayProcess
from tests.support.raw_http import CHUNKED_HEAD, RawHttpServer, Received, chunk, response

EMBEDDINGS = 1000
DEADLINE_S = 8


def completion(text: str) -> bytes:
    return orjson.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    })


def embeddings(count: int) -> bytes:
    data = [{"object": "embedding", "index": i, "embedding": [0.0123456789] * 96} for i in range(count)]
    return orjson.dumps({"object": "list", "data": data, "model": "e", "usage": {"prompt_tokens": 3, "total_tokens": 3}})


async def hostile(request: Received, writer: asyncio.StreamWriter) -> bool:
    """What it answers depends on the model asked for."""
    model = orjson.loads(request.body).get("model")
    if model == "big":
        writer.write(response(200, embeddings(EMBEDDINGS), (("content-type", "application/json"),)))
    elif model == "flood":
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for n in range(1_000_000):  # headers without end, as far as the gateway can tell
            writer.write(b"x-flood-%d: %s\r\n" % (n, b"v" * 64))
            if n % 500 == 0:
                await writer.drain()
    elif model == "endless":
        writer.write(CHUNKED_HEAD + chunk(b"data: "))
        while True:  # one event that never ends, until the gateway hangs up
            writer.write(chunk(b"x" * 65536))
            await writer.drain()
    elif model == "hold":
        return True  # no answer: the call stays in flight until the gateway hangs up
    else:
        writer.write(response(200, completion("ok"), (("content-type", "application/json"),)))
    await writer.drain()
    return True


def policy(upstream: str, key: str) -> str:
    return textwrap.dedent(f"""\
        version: 1
        defaults:
          request_timeout_s: {DEADLINE_S}
          max_output_tokens: 256
        upstreams:
          raw:
            kind: openai
            base_url: {upstream}/v1
            max_event_bytes: 1048576
        models:
          big: {{upstream: raw, price: {{input: 0.02, output: 0}}}}
          flood: {{upstream: raw, price: {{input: 0.15, output: 0.60}}}}
          endless: {{upstream: raw, price: {{input: 0.15, output: 0.60}}}}
          hold: {{upstream: raw, price: {{input: 0.15, output: 0.60}}}}
          ok: {{upstream: raw, price: {{input: 0.15, output: 0.60}}}}
        tenants:
          acme:
            api_keys: ["{key_digest(key)}"]
            limits: {{tpm: 1200, max_queue: 8, max_wait_s: 10}}
        """)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class HealthProbe:
    """GETs /healthz back to back in a thread while a hostile call runs; keeps each time."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.times: list[float] = []
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                assert client.get(self.url + "/healthz").status_code == 200
                self.times.append(time.perf_counter() - started)
                self._first.set()
                self._stop.wait(0.02)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        assert self._first.wait(30), "the gateway never answered /healthz"  # probing before the call starts
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


class Setup:
    def __init__(self, server: RawHttpServer, gateway: GatewayProcess, key: str) -> None:
        self.server, self.gateway, self.key = server, gateway, key
        self.client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=30)

    def upstream_calls(self, model: str) -> int:
        return sum(1 for r in self.server.requests if orjson.loads(r.body).get("model") == model)


Scenario = Callable[[Setup], Awaitable[None]]


def with_gateway(workdir: Path, scenario: Scenario) -> None:
    """Runs `scenario` in an event loop with the hostile upstream and a gateway in front."""

    async def main() -> None:
        async with RawHttpServer(hostile) as server:
            key = new_api_key()
            path = workdir / "policy.yaml"
            path.write_text(policy(server.url, key))
            gateway = GatewayProcess(path, {"GATEWAY_VAR_DIR": str(workdir / "var")}, workdir / "gateway.log")
            await asyncio.to_thread(gateway.start)
            setup = Setup(server, gateway, key)
            await setup.client.models.list()  # the rest of start-up (the web framework) is done too
            try:
                await scenario(setup)
            finally:
                await asyncio.to_thread(gateway.stop)

    asyncio.run(main())


async def _gather_text(stream: AsyncIterator[object]) -> None:
    async for _ in stream:
        pass


def test_a_large_answer_comes_through_whole_from_one_upstream_call(tmp_path: Path) -> None:
    async def scenario(setup: Setup) -> None:
        reply = await setup.client.embeddings.create(model="big", input="hello")
        assert len(reply.data) == EMBEDDINGS
        assert setup.upstream_calls("big") == 1

    with_gateway(tmp_path, scenario)


async def refused_in_time(setup: Setup, model: str, *, stream: bool) -> openai.APIStatusError:
    """Calls `model` while probing /healthz: the call must fail inside the deadline, the
    event loop must keep answering (a frozen loop shows in every probe, not in one late
    answer on a shared machine) and the gateway's memory must stay bounded."""
    before = rss_mib(setup.gateway.pid)
    with HealthProbe(setup.gateway.url) as probe:
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as caught:
            answer = await setup.client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                                stream=stream)
            if stream:
                await _gather_text(answer)  # type: ignore[arg-type]
        elapsed = time.monotonic() - started
    assert elapsed < DEADLINE_S
    assert probe.times and statistics.median(probe.times) < 0.1 and max(probe.times) < 2.0
    assert rss_mib(setup.gateway.pid) - before < 100
    return caught.value


def test_a_header_flood_is_a_502_inside_the_deadline_and_the_gateway_keeps_answering(tmp_path: Path) -> None:
    async def scenario(setup: Setup) -> None:
        refused = await refused_in_time(setup, "flood", stream=False)
        assert refused.status_code == 502 and refused.response.headers["x-should-retry"] == "false"
        assert setup.upstream_calls("flood") == 1  # refused, never asked again

    with_gateway(tmp_path, scenario)


def test_an_event_that_never_ends_is_a_502_inside_the_deadline_with_memory_bounded(tmp_path: Path) -> None:
    async def scenario(setup: Setup) -> None:
        refused = await refused_in_time(setup, "endless", stream=True)
        assert refused.status_code == 502 and "upstream_reply_too_large" in refused.response.text
        await setup.server.connection_ended(0)  # the gateway hung up on it

    with_gateway(tmp_path, scenario)


def test_a_client_that_hangs_up_mid_call_takes_the_upstream_call_with_it(tmp_path: Path) -> None:
    async def scenario(setup: Setup) -> None:
        async with httpx.AsyncClient(base_url=setup.gateway.url, timeout=30) as client:
            call = asyncio.create_task(client.post("/v1/chat/completions", headers={"authorization": f"Bearer {setup.key}"},
                                                   json={"model": "hold", "messages": [{"role": "user", "content": "hi"}]}))
            await setup.server.requests_received(1)  # the call reached the upstream
            call.cancel()  # the client hangs up
            with pytest.raises(asyncio.CancelledError):
                await call
        await setup.server.connection_ended(0)  # the gateway dropped the upstream call at once, not at its deadline

    with_gateway(tmp_path, scenario)


def test_a_client_that_hangs_up_while_queued_is_never_sent_upstream(tmp_path: Path) -> None:
    """tpm 1,200: the held call takes nearly all of it, so the next ones wait in the queue
    for the bucket to refill, in order. The one whose client leaves must not be sent
    when its turn would have come; the one behind it is."""

    def chat(text: str, max_tokens: int, model: str = "ok") -> dict[str, object]:
        return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}

    async def scenario(setup: Setup) -> None:
        auth = {"authorization": f"Bearer {setup.key}"}
        async with httpx.AsyncClient(base_url=setup.gateway.url, timeout=30) as client:
            held = asyncio.create_task(client.post("/v1/chat/completions", headers=auth, json=chat("first", 1140, "hold")))
            await setup.server.requests_received(1)
            leaving = asyncio.create_task(client.post("/v1/chat/completions", headers=auth, json=chat("second", 60)))
            await asyncio.sleep(0.3)  # queued behind the tokens the first call holds
            leaving.cancel()
            with pytest.raises(asyncio.CancelledError):
                await leaving
            staying = await client.post("/v1/chat/completions", headers=auth, json=chat("third", 60))
            assert staying.status_code == 200
            texts = [orjson.loads(r.body)["messages"][0]["content"] for r in setup.server.requests]
            assert texts == ["first", "third"]
            held.cancel()

    with_gateway(tmp_path, scenario)
