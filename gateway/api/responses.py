"""Stored responses: `GET /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`
and `DELETE /v1/responses/{id}`, each for the caller's tenant only (another tenant's
id is a 404, as an unknown one is). `POST /v1/responses` is a hot path (hot_paths)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.accounting.responses_store import StoredResponse
from gateway.errors import InvalidRequest
from gateway.pipeline.responses import not_found
from gateway.services import Services

MAX_LIST = 100


def build_responses_router() -> APIRouter:
    router = APIRouter(prefix="/v1/responses")

    @router.get("/{response_id}")
    async def retrieve(request: Request, response_id: str) -> Response:
        stored = await _stored(request, response_id)
        return _json(stored.response)

    @router.get("/{response_id}/input_items")
    async def input_items(request: Request, response_id: str) -> Response:
        stored = await _stored(request, response_id)
        return _json(listing(stored, request.query_params.get("order", "desc"), request.query_params.get("limit", "20"),
                             request.query_params.get("after")))

    @router.delete("/{response_id}")
    async def delete(request: Request, response_id: str) -> Response:
        services: Services = request.app.state.services
        tenant = services.pipeline.identify(request.headers).tenant
        if not await services.responses.store.delete(tenant, response_id):
            raise not_found(response_id)
        return _json({"id": response_id, "object": "response.deleted", "deleted": True})

    return router


async def _stored(request: Request, response_id: str) -> StoredResponse:
    services: Services = request.app.state.services
    tenant = services.pipeline.identify(request.headers).tenant
    stored = await services.responses.store.get(tenant, response_id)
    if stored is None:
        raise not_found(response_id)
    return stored


def listing(stored: StoredResponse, order: str, limit: str, after: str | None) -> dict[str, Any]:
    if order not in ("asc", "desc"):
        raise InvalidRequest("`order` must be asc or desc", param="order")
    if not limit.isdigit() or not 1 <= int(limit) <= MAX_LIST:
        raise InvalidRequest(f"`limit` must be an integer from 1 to {MAX_LIST}", param="limit")
    items = stored.input_items if order == "asc" else stored.input_items[::-1]
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise InvalidRequest(f"`after`: no item `{after}` in this response's input", param="after")
        items = items[ids.index(after) + 1:]
    page = items[: int(limit)]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > len(page)}


def _json(body: dict[str, Any]) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")
