"""The OpenAI-compatible surface served by the framework app: the models list. The
per-call endpoints (chat, completions, embeddings) are plain ASGI: see hot_paths."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.services import Services


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def build_router() -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        services = services_of(request)
        owner = services.pipeline.identify(request.headers)
        created = int(services.started_at)
        names = services.policies.current.visible_models(owner.tenant)
        data = [{"id": name, "object": "model", "created": created, "owned_by": "gateway"} for name in names]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")

    return router
