"""Tool invocation (tenant key) and tool-cache invalidation (admin key)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.admin import admin_services
from gateway.caching.response_cache import cache_scope
from gateway.errors import NotFound
from gateway.services import Services


def build_tools_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/tools/{name}/invoke")
    async def invoke(name: str, request: Request) -> Response:
        services: Services = request.app.state.services
        owner = services.pipeline.identify(request.headers)
        body, headers = await services.tools.invoke(owner, name, await request.body(), request.headers)
        return Response(body, media_type="application/json", headers=headers)

    @router.delete("/admin/tools/{name}/cache")
    async def invalidate(name: str, request: Request) -> Response:
        services = admin_services(request)
        policy = services.policies.current
        if name not in policy.policy.tools:
            raise NotFound(f"no tool `{name}` is declared in the policy")
        scopes = {cache_scope(policy, tenant) for tenant in policy.policy.tenants}
        await services.tools.cache.invalidate(name, scopes)
        return Response(orjson.dumps({"tool": name, "invalidated": True}), media_type="application/json")

    return router

