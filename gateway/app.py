"""create_app(settings): lifespan, routers and error handling, assembled in one place."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI

from gateway.api.admin import build_admin_router
from gateway.api.errors import install_error_handlers
from gateway.api.health import build_health_router
from gateway.api.hot_paths import HotPaths
from gateway.api.openai_routes import build_router
from gateway.api.tasks import build_tasks_router
from gateway.api.tools import build_tools_router
from gateway.services import Services
from gateway.settings import Settings
from gateway.supervision import stop_with_supervisor

if TYPE_CHECKING:
    from gateway.accounting.prices import PriceCatalog


def create_app(settings: Settings | None = None, catalog: PriceCatalog | None = None) -> HotPaths:
    """`catalog`: prices already read from the settings' pricing folder, if any."""
    settings = settings or Settings()
    stop_with_supervisor(os.environ)  # a worker of `serve --workers N`: not outliving the supervisor

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = Services.build(settings, catalog)
        app.state.services = services
        services.start_background()
        try:
            yield
        finally:
            await services.aclose()

    app = FastAPI(title="gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.include_router(build_health_router())
    app.include_router(build_router())
    app.include_router(build_tasks_router())
    app.include_router(build_admin_router())
    app.include_router(build_tools_router())
    return HotPaths(app)
