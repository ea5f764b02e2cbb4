"""Tasks: POST /v1/tasks opens one with limits; GET /v1/tasks/{id} shows its books."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import Response

from gateway.accounting.tasks import task_limits
from gateway.errors import InvalidRequest, NotFound
from gateway.pipeline.parse import parse_json_object
from gateway.services import Services

FIELDS = ("budget_usd", "max_calls", "max_tokens", "deadline_s")


def build_tasks_router() -> APIRouter:
    router = APIRouter(prefix="/v1/tasks")

    @router.post("")
    async def create_task(request: Request) -> Response:
        services: Services = request.app.state.services
        owner = services.pipeline.identify(request.headers)
        body = parse_json_object(await request.body() or b"{}")
        unknown = sorted(set(body) - set(FIELDS))
        if unknown:
            raise InvalidRequest(f"unknown task fields: {', '.join(unknown)}; allowed: {', '.join(FIELDS)}")
        policy = services.policies.current.policy
        try:
            limits = task_limits(body, policy.tenants[owner.tenant].task_limits, policy.defaults.task_limits)
        except ValidationError as exc:
            raise InvalidRequest(f"invalid task limits: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}") from None
        task = await services.accounting.tasks.create(owner.tenant, owner.key_id, limits)
        body_out = {
            "id": task.id, "object": "task",
            "budget_usd": str(limits.budget_usd) if limits.budget_usd is not None else None,
            "max_calls": limits.max_calls, "max_tokens": limits.max_tokens,
            "deadline_at": task.deadline_at.isoformat() if task.deadline_at else None,
        }
        return Response(orjson.dumps(body_out), status_code=201, media_type="application/json")

    @router.get("/{task_id}")
    async def task_books(task_id: str, request: Request) -> Response:
        services: Services = request.app.state.services
        owner = services.pipeline.identify(request.headers)
        task = await services.accounting.tasks.get(task_id)
        if task is None or task.tenant != owner.tenant:
            raise NotFound(f"task `{task_id}` does not exist for this API key's tenant")
        return Response(orjson.dumps(await services.accounting.tasks.books(task)), media_type="application/json")

    return router
