"""create_app(settings): the ASGI app uvicorn serves.

It owns the lifespan (the services are built at start-up and closed at shutdown) and
sends each request where it belongs: the model-call paths (`api/hot_paths.py`: they only
move bytes between the client and the pipeline) and liveness are answered here, every
other route by the framework app, built at start-up."""

from __future__ import annotations

import gc
import os
import traceback
from typing import TYPE_CHECKING

from gateway.api.hot_paths import HOT, ASGIApp, HotPaths, Receive, Scope, Send, hot_endpoint, send_error, send_whole
from gateway.errors import MethodNotAllowed
from gateway.services import Services
from gateway.settings import Settings
from gateway.supervision import stop_with_supervisor

if TYPE_CHECKING:
    from gateway.accounting.prices import PriceCatalog

LIVE = b'{"status":"ok"}'
# The paths answered here, not by the framework, and the methods they take.
OWN_METHODS = {"/healthz": ("GET", "HEAD"), **{path: ("POST",) for path in HOT}}


class GatewayApp:
    def __init__(self, settings: Settings, catalog: PriceCatalog | None) -> None:
        self.settings = settings
        self.catalog = catalog
        self._hot: HotPaths | None = None  # from start-up on
        self._framework: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "http":
            endpoint = hot_endpoint(scope)
            if endpoint is not None and self._hot is not None:
                await self._hot(endpoint, scope, receive, send)
                return
            allowed = OWN_METHODS.get(scope["path"])
            if allowed is not None and scope["method"] not in allowed:
                error = MethodNotAllowed(scope["method"], scope["path"], ", ".join(allowed))
                error.headers["x-request-id"] = self._request_id()
                await send_error(send, error)
                return
            if scope["path"] == "/healthz":  # HEAD too: the server sends no body
                await send_whole(send, 200, LIVE, {"x-request-id": self._request_id()})
                return
        if self._framework is None:
            raise RuntimeError("the gateway serves requests only after its lifespan start-up")
        await self._framework(scope, receive, send)

    def _request_id(self) -> str:
        assert self._hot is not None, "served only after start-up"
        return self._hot.services.pipeline.parts.ids.next()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """ASGI's lifespan protocol. A start-up that fails sends its traceback, which
        uvicorn logs before it exits with status 3."""
        started = False
        try:
            await receive()  # lifespan.startup
            services = Services.build(self.settings, self.catalog)
            services.start_background()
            try:
                self._hot = HotPaths(services)
                # Imported here: the CLI's other commands import this module without serving.
                from gateway.api.framework import build_framework

                self._framework = build_framework(services)
                # What start-up built (modules, policy, price map, routes) lives as long as
                # the process: frozen, the cyclic collector's full passes skip it instead of
                # stalling every call in flight (bench/gc_pauses.py).
                gc.freeze()
                await send({"type": "lifespan.startup.complete"})
                started = True
                await receive()  # lifespan.shutdown
            finally:
                await services.aclose()
                gc.unfreeze()  # collectable again, for a process that goes on (an app run in tests)
        except BaseException:
            phase = "shutdown" if started else "startup"
            await send({"type": f"lifespan.{phase}.failed", "message": traceback.format_exc()})
            raise
        await send({"type": "lifespan.shutdown.complete"})


def create_app(settings: Settings | None = None, catalog: PriceCatalog | None = None) -> GatewayApp:
    """`catalog`: prices already read from the settings' pricing folder, if any."""
    stop_with_supervisor(os.environ)  # a worker of `serve --workers N`: not outliving the supervisor
    return GatewayApp(settings or Settings(), catalog)
