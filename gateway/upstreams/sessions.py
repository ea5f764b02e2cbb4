"""The one place HTTP client sessions are made: model traffic, tool calls and provider
reports all go out through aiohttp sessions built here, so TLS, proxies, pooling and
the bounds on what an upstream may send back are set once.

- TLS is always verified. A policy may name a CA bundle to trust instead of the
  system's, and a client certificate and key for mutual TLS; there is no switch to
  turn verification off.
- Proxies come from `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` and `NO_PROXY`, read when
  a session is made, as the provider SDKs do (`proxy_for`). `~/.netrc` is not read:
  credentials go only where the policy sends them.
- An upstream's response head is bounded in count and size (aiohttp refuses more than
  `MAX_HEADERS` fields or a field over `MAX_FIELD_BYTES`), so a misbehaving upstream
  cannot flood the event loop with headers.
- Cookies an upstream sets are dropped: a session is shared by every tenant."""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import aiohttp

MAX_HEADERS: Final = 128
MAX_FIELD_BYTES: Final = 16 * 1024
MAX_LINE_BYTES: Final = 16 * 1024


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """What an upstream's policy says about TLS beyond the system's defaults."""

    ca_bundle: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None


def tls_context(files: TlsFiles) -> ssl.SSLContext:
    """A verifying client context: the system's CAs, or only the named bundle's."""
    context = ssl.create_default_context(cafile=str(files.ca_bundle) if files.ca_bundle else None)
    if files.client_cert is not None:
        context.load_cert_chain(str(files.client_cert), str(files.client_key) if files.client_key else None)
    context.set_alpn_protocols(["http/1.1"])
    return context


def proxy_for(url: str) -> str | None:
    """The proxy the environment names for `url`, or None (none set, or NO_PROXY matches)."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    if urllib.request.proxy_bypass(host) or (parts.hostname and urllib.request.proxy_bypass(parts.hostname)):
        return None
    return proxies.get(parts.scheme) or proxies.get("all")


def new_session(*, max_connections: int, keepalive_s: float, connect_timeout_s: float | None = None,
                tls: TlsFiles | None = None, headers: dict[str, str] | None = None) -> aiohttp.ClientSession:
    """A pooled session (`max_connections` per origin). Call from the event loop that uses it."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=max_connections, keepalive_timeout=keepalive_s,
                                     ssl=tls_context(tls or TlsFiles()))
    return aiohttp.ClientSession(
        connector=connector,
        headers=headers,
        # Sent as given: no User-Agent or Accept of aiohttp's own, and no compression to undo.
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,  # proxies are resolved by proxy_for; netrc is never read
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
        max_headers=MAX_HEADERS,
        max_field_size=MAX_FIELD_BYTES,
        max_line_size=MAX_LINE_BYTES,
        raise_for_status=False,
    )


async def read_bounded(response: aiohttp.ClientResponse, limit: int, too_large: Callable[[], Exception]) -> bytes:
    """The whole body, or `too_large()` raised (and the connection dropped) once it is
    known to be over `limit` bytes: from its content-length, or as it arrives."""
    declared = response.content_length
    if declared is not None and declared > limit:
        response.close()
        raise too_large()
    parts: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            response.close()
            raise too_large()
        parts.append(chunk)
    return b"".join(parts)
