"""The framework app: every route but the hot paths and liveness (models list, readiness,
metrics, admin, tasks, tools, the finance dashboard), with OpenAI-shaped errors and an
`x-request-id` on every response. Importing the framework and building its routes costs
about a third of a second of CPU, so it is built off the start-up path (see gateway.app)."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.admin import build_admin_router
from gateway.api.body_limit import BodyLimit
from gateway.api.errors import install_error_handlers
from gateway.api.health import build_health_router
from gateway.api.openai_routes import build_router
from gateway.api.responses import build_responses_router
from gateway.api.tasks import build_tasks_router
from gateway.api.tools import build_tools_router
from gateway.api.ui import build_ui_router
from gateway.services import Services
from gateway.telemetry.ids import IdSource

REQUEST_ID = b"x-request-id"


def build_framework(services: Services) -> ASGIApp:
    """The app for `services`, already started: it has no lifespan of its own."""
    app = FastAPI(title="gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.services = services
    install_error_handlers(app)
    app.include_router(build_health_router())
    app.include_router(build_router())
    app.include_router(build_tasks_router())
    app.include_router(build_responses_router())
    app.include_router(build_admin_router())
    app.include_router(build_tools_router())
    app.include_router(build_ui_router())
    app.add_middleware(BodyLimit, max_body_bytes=lambda: services.policies.current.policy.defaults.max_body_bytes)
    # Around the whole app, not one of its middlewares: Starlette renders a 500 outside those.
    return RequestIds(app, services.pipeline.parts.ids)


class RequestIds:
    """Gives each response an `x-request-id` (error responses and unknown paths too),
    unless its handler named one (a tool call names its ledger entry's). The id is
    minted here, as the hot paths mint theirs: a client's own `x-request-id` is not
    taken. Handlers find it in `request.state.request_id`."""

    def __init__(self, app: ASGIApp, ids: IdSource) -> None:
        self.app = app
        self.ids = ids

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = self.ids.next()
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == REQUEST_ID for name, _ in headers):
                    message = {**message, "headers": [*headers, (REQUEST_ID, request_id.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_id)
