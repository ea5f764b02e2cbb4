"""An HTTP upstream against real servers over real loopback sockets: whole answers of
any size up to the bound, and nothing past it; a head flood; streams and their abort;
the deadline; TLS with the policy's CA bundle and client certificate; proxies from
the environment. Servers wait on events, never on the clock."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvloop

from gateway.errors import UpstreamBadReply, UpstreamError, UpstreamReplyTooLarge, UpstreamTimeout
from gateway.routing.policy import Upstream as UpstreamConfig
from gateway.upstreams.base import StreamBroken
from gateway.upstreams.http import HttpUpstream
from tests.support.forward_proxy import ForwardProxy
from tests.support.raw_http import CHUNKED_HEAD, LAST_CHUNK, RawHttpServer, Received, chunk, response

Run = Callable[[Coroutine[Any, Any, None]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    return uvloop.run if request.param == "uvloop" else asyncio.run  # type: ignore[return-value]


def upstream(base: str, **config: Any) -> HttpUpstream:
    return HttpUpstream("up", UpstreamConfig.model_validate({"kind": "openai", "base_url": base + "/v1", **config}))


def embeddings(count: int) -> bytes:
    data = [{"object": "embedding", "index": i, "embedding": [0.0123456789] * 96} for i in range(count)]
    return orjson.dumps({"object": "list", "data": data, "model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1}})


# -- whole answers -------------------------------------------------------------------------


def test_a_large_answer_arrives_whole_from_one_request(run: Run) -> None:
    big = embeddings(1000)
    assert len(big) > 1_000_000

    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(response(200, big, (("content-type", "application/json"),)))
        return True

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            up = upstream(server.url)
            reply = await up.send("/embeddings", b"{}", timeout_s=10)
            assert (reply.status, reply.body) == (200, big)
            assert len(server.requests) == 1 and server.requests[0].target == "/v1/embeddings"
            await up.aclose()

    run(scenario())


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_answer_over_the_bound_is_refused_and_marked_not_worth_retrying(run: Run, framing: str) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        if framing == "content-length":
            writer.write(response(200, b"x" * 5000))
        else:
            writer.write(CHUNKED_HEAD + chunk(b"x" * 3000) + chunk(b"x" * 3000) + LAST_CHUNK)
        return True

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            up = upstream(server.url, max_response_bytes=4096)
            with pytest.raises(UpstreamReplyTooLarge) as caught:
                await up.send("/chat/completions", b"{}", timeout_s=10)
            assert caught.value.http_status == 502 and not caught.value.retryable
            await up.aclose()

    run(scenario())


@pytest.mark.parametrize("flood", ["many", "huge"])
def test_a_flood_of_response_headers_is_refused_at_once(run: Run, flood: str) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        if flood == "huge":
            writer.write(b"x-huge: " + b"a" * (1024 * 1024))
        else:
            for n in range(100_000):  # endless, as far as the client can tell
                writer.write(b"x-h%d: v\r\n" % n)
                if n % 1000 == 0:
                    await writer.drain()
        await writer.drain()
        return False

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            up = upstream(server.url)
            started = time.monotonic()
            with pytest.raises(UpstreamBadReply) as caught:
                await up.send("/chat/completions", b"{}", timeout_s=30)
            assert caught.value.http_status == 502 and not caught.value.retryable
            assert time.monotonic() - started < 10  # the bound, not the deadline, ended it
            await up.aclose()

    run(scenario())


def test_an_upstream_that_never_answers_is_a_timeout_at_the_deadline(run: Run) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        await asyncio.Event().wait()
        return False

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            up = upstream(server.url)
            with pytest.raises(UpstreamTimeout):
                await up.send("/chat/completions", b"{}", timeout_s=0.2)
            await up.aclose()

    run(scenario())


def test_a_refused_connection_is_an_upstream_error(run: Run) -> None:
    async def scenario() -> None:
        async with RawHttpServer(lambda r, w: asyncio.sleep(0, False)) as server:
            url = server.url
        up = upstream(url)
        with pytest.raises(UpstreamError, match="could not be reached"):
            await up.send("/chat/completions", b"{}", timeout_s=5)
        await up.aclose()

    run(scenario())


# -- streams --------------------------------------------------------------------------------


def test_a_stream_arrives_piece_by_piece_and_closing_it_early_drops_the_connection(run: Run) -> None:
    more = asyncio.Event()

    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED_HEAD + chunk(b"data: one\n\n"))
        await writer.drain()
        await more.wait()
        writer.write(chunk(b"data: two\n\n"))
        while True:  # a model still generating, until the client hangs up
            writer.write(chunk(b"data: more\n\n"))
            await writer.drain()
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            up = upstream(server.url)
            stream = await up.open_stream("/chat/completions", b"{}", timeout_s=10)
            pieces = stream.aiter_raw()
            assert await anext(pieces) == b"data: one\n\n"
            more.set()
            assert (await anext(pieces)).startswith(b"data: two\n\n")
            await stream.aclose()
            await server.connection_ended(0)  # how vLLM learns to abort the request
            await up.aclose()

    run(scenario())


def test_a_stream_past_its_deadline_breaks_with_the_deadline_named(run: Run) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED_HEAD + chunk(b"data: one\n\n"))
        await writer.drain()
        await asyncio.Event().wait()
        return False

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            up = upstream(server.url)
            stream = await up.open_stream("/chat/completions", b"{}", timeout_s=0.3)
            with pytest.raises(StreamBroken) as caught:
                async for _ in stream.aiter_raw():
                    pass
            assert caught.value.deadline
            await stream.aclose()
            await up.aclose()

    run(scenario())


# -- TLS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by it."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make test certificates")
    where = tmp_path_factory.mktemp("pki")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=test-ca", "-days", "2")
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        (where / f"{name}.ext").write_text(extension + "\n")
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return where


def server_tls(pki: Path, require_client: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki / "server.pem", pki / "server.key")
    if require_client:
        context.load_verify_locations(pki / "ca.pem")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def ok(request: Received, writer: asyncio.StreamWriter) -> bool:
    writer.write(response(200, b'{"ok":true}'))
    return True


def test_tls_is_verified_against_the_policy_s_ca_bundle(run: Run, pki: Path) -> None:
    async def scenario() -> None:
        async with RawHttpServer(ok, tls=server_tls(pki, require_client=False)) as server:
            trusted = upstream(server.url, ca_bundle=str(pki / "ca.pem"))
            assert (await trusted.send("/chat/completions", b"{}", timeout_s=10)).status == 200
            system_cas = upstream(server.url)  # the test CA is not among them: refused
            with pytest.raises(UpstreamError):
                await system_cas.send("/chat/completions", b"{}", timeout_s=10)
            await trusted.aclose()
            await system_cas.aclose()

    run(scenario())


def test_mutual_tls_sends_the_policy_s_client_certificate(run: Run, pki: Path) -> None:
    async def scenario() -> None:
        async with RawHttpServer(ok, tls=server_tls(pki, require_client=True)) as server:
            with_cert = upstream(server.url, ca_bundle=str(pki / "ca.pem"), client_cert=str(pki / "client.pem"),
                                 client_key=str(pki / "client.key"))
            assert (await with_cert.send("/chat/completions", b"{}", timeout_s=10)).status == 200
            without = upstream(server.url, ca_bundle=str(pki / "ca.pem"))
            with pytest.raises(UpstreamError):
                await without.send("/chat/completions", b"{}", timeout_s=10)
            await with_cert.aclose()
            await without.aclose()

    run(scenario())


# -- proxies --------------------------------------------------------------------------------


def test_a_host_only_the_proxy_can_resolve_is_reached_through_http_proxy(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        async with RawHttpServer(ok) as server, ForwardProxy({"models.internal.invalid": "127.0.0.1"}) as proxy:
            port = server.url.rsplit(":", 1)[1]
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            monkeypatch.delenv("NO_PROXY", raising=False)
            monkeypatch.delenv("no_proxy", raising=False)
            through = upstream(f"http://models.internal.invalid:{port}")
            assert (await through.send("/chat/completions", b"{}", timeout_s=10)).status == 200
            assert proxy.seen == [f"POST http://models.internal.invalid:{port}/v1/chat/completions"]
            monkeypatch.setenv("NO_PROXY", "models.internal.invalid")
            bypassed = upstream(f"http://models.internal.invalid:{port}")  # direct: the name does not resolve
            with pytest.raises(UpstreamError):
                await bypassed.send("/chat/completions", b"{}", timeout_s=10)
            assert len(proxy.seen) == 1
            await through.aclose()
            await bypassed.aclose()

    run(scenario())


def test_https_goes_through_the_proxy_in_a_tunnel(run: Run, pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        async with RawHttpServer(ok, tls=server_tls(pki, require_client=False)) as server, \
                ForwardProxy({"127.0.0.1": "127.0.0.1"}) as proxy:
            monkeypatch.setenv("HTTPS_PROXY", proxy.url)
            monkeypatch.delenv("NO_PROXY", raising=False)
            monkeypatch.delenv("no_proxy", raising=False)
            up = upstream(server.url, ca_bundle=str(pki / "ca.pem"))
            assert (await up.send("/chat/completions", b"{}", timeout_s=10)).status == 200
            assert proxy.seen == [f"CONNECT {server.url.removeprefix('https://')}"]
            await up.aclose()

    run(scenario())
