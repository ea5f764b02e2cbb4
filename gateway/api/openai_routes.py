"""The OpenAI-compatible surface. Handlers only move bytes: they read the body (with
a size limit), hand it to the pipeline, and turn its reply into a response."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from gateway.errors import BodyTooLarge
from gateway.pipeline.runner import JsonReply, Pipeline, StreamReply
from gateway.services import Services


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"the request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def to_response(reply: JsonReply | StreamReply) -> Response:
    if isinstance(reply, StreamReply):
        headers = {**reply.headers, "cache-control": "no-cache", "x-accel-buffering": "no"}
        return StreamingResponse(reply.chunks, media_type="text/event-stream", headers=headers)
    return Response(reply.body, status_code=reply.status, media_type="application/json", headers=reply.headers)


async def _run(request: Request, endpoint: str) -> Response:
    services = services_of(request)
    pipeline: Pipeline = services.pipeline
    raw = await read_body(request, services.policies.current.policy.defaults.max_body_bytes)
    return to_response(await pipeline.run(endpoint, raw, request.headers))


def build_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _run(request, "chat.completions")

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _run(request, "completions")

    @router.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await _run(request, "embeddings")

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        services = services_of(request)
        owner = services.pipeline.identify(request.headers)
        created = int(services.started_at)
        names = services.policies.current.visible_models(owner.tenant)
        data = [{"id": name, "object": "model", "created": created, "owned_by": "gateway"} for name in names]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")

    return router
