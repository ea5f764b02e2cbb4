"""The framework app: every route but the hot paths and liveness (models list, readiness,
metrics, admin, tasks, tools), with OpenAI-shaped errors. Importing the framework and
building its routes costs about a third of a second of CPU, so it is built off the
start-up path (see gateway.app)."""

from __future__ import annotations

from fastapi import FastAPI

from gateway.api.admin import build_admin_router
from gateway.api.body_limit import BodyLimit
from gateway.api.errors import install_error_handlers
from gateway.api.health import build_health_router
from gateway.api.openai_routes import build_router
from gateway.api.tasks import build_tasks_router
from gateway.api.tools import build_tools_router
from gateway.services import Services


def build_framework(services: Services) -> FastAPI:
    """The app for `services`, already started: it has no lifespan of its own."""
    app = FastAPI(title="gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.services = services
    install_error_handlers(app)
    app.include_router(build_health_router())
    app.include_router(build_router())
    app.include_router(build_tasks_router())
    app.include_router(build_admin_router())
    app.include_router(build_tools_router())
    app.add_middleware(BodyLimit, max_body_bytes=lambda: services.policies.current.policy.defaults.max_body_bytes)
    return app
