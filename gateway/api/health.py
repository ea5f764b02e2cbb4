"""Readiness and Prometheus metrics (liveness, /healthz, is answered in gateway.app)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from gateway.services import Services


def build_health_router() -> APIRouter:
    router = APIRouter()

    @router.get("/readyz")
    async def readyz(request: Request) -> Response:
        services: Services = request.app.state.services
        checks = await services.readiness()
        ready = all(ok for ok, _ in checks.values())
        body = {"status": "ready" if ready else "not ready", "checks": {k: {"ok": ok, "detail": d} for k, (ok, d) in checks.items()}}
        return Response(orjson.dumps(body), status_code=200 if ready else 503, media_type="application/json")

    @router.get("/metrics")
    async def metrics(request: Request) -> Response:
        services: Services = request.app.state.services
        services.accounting.backlog.run()  # the answered calls whose metrics are still waiting
        return Response(services.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return router
