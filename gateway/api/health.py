"""Readiness and Prometheus metrics (liveness, /healthz, is answered in gateway.app).

/metrics shows per-tenant series only to a scraper with the metrics key
(`Authorization: Bearer <GATEWAY_METRICS_KEY>`); without a key configured it serves
the process and the totals over tenants to anyone."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from gateway.auth.keys import bearer_matches
from gateway.errors import AuthenticationFailed
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
        key = services.settings.gateway_metrics_key
        if key is not None and not bearer_matches(request.headers.get("authorization", ""), key):
            raise AuthenticationFailed("the metrics need `Authorization: Bearer <GATEWAY_METRICS_KEY>`",
                                       headers={"www-authenticate": 'Bearer realm="metrics"'})
        services.accounting.deferred.run()  # the answered calls whose metrics are still waiting
        return Response(services.metrics.render(with_tenants=key is not None), media_type=CONTENT_TYPE_LATEST)

    return router
