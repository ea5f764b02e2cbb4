"""The floor: a proxy on the gateway's own stack that does nothing but forward.

    python bench/passthrough.py --port 8090 --upstream http://127.0.0.1:9100

Served by uvicorn (httptools, uvloop), forwarding with one pooled aiohttp session - the
same server and client the gateway runs on - with no key check, parsing, admission,
hold, cache or books. What it adds on a machine is what any proxy on this stack adds
there (the extra hops between cores, the server and the client), so `ours` minus
`passthrough` in one bench/compare.py run is what the gateway's own work costs, on
whatever hardware the run happens to get.

It passes the client's `Authorization` and `Content-Type` on, relays a streamed
answer chunk by chunk as it arrives, and sends every other answer whole. Not a
product: a measuring stick, kept as small as the stack allows.
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import uvicorn

PASSED_HEADERS = (b"authorization", b"content-type")


class Passthrough:
    """An ASGI app that forwards each request, path and all, to one upstream origin."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._forward(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.session = aiohttp.ClientSession(auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                                                     skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert self.session is not None
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in PASSED_HEADERS}
        async with self.session.request(scope["method"], self.upstream + scope["path"], data=b"".join(chunks), headers=headers) as reply:
            kind = reply.headers.get("content-type", "application/json").encode("latin-1")
            if kind.startswith(b"text/event-stream"):
                await send({"type": "http.response.start", "status": reply.status, "headers": [(b"content-type", kind)]})
                async for chunk in reply.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return
            body = await reply.read()
        await send({"type": "http.response.start", "status": reply.status,
                    "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the origin every path goes to, e.g. http://127.0.0.1:9100")
    args = parser.parse_args(argv)
    uvicorn.run(Passthrough(args.upstream), host=args.host, port=args.port, http="httptools", loop="uvloop",
                lifespan="on", log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
