"""The OpenAI-compatible surface served by the framework app: the models list and one
model. The per-call endpoints (chat, completions, embeddings) are plain ASGI: see
hot_paths."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.errors import ModelNotFound
from gateway.services import Services


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def build_router() -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        services = services_of(request)
        data = [model_object(services, name) for name in visible_models(services, request)]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")

    @router.get("/v1/models/{model_id:path}")  # ids may hold a slash (org/model)
    async def model(request: Request, model_id: str) -> Response:
        services = services_of(request)
        if model_id not in visible_models(services, request):
            raise ModelNotFound(f"The model `{model_id}` does not exist or you do not have access to it.", param="model")
        return Response(orjson.dumps(model_object(services, model_id)), media_type="application/json")

    return router


def visible_models(services: Services, request: Request) -> list[str]:
    """The models and routes the caller's tenant may use (it must present its key)."""
    policy = services.policies.current  # one policy for both, even if a reload swaps it meanwhile
    owner = services.pipeline.identify(request.headers, policy)
    return policy.visible_models(owner.tenant)


def model_object(services: Services, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(services.started_at), "owned_by": "gateway"}
