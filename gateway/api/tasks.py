"""Tasks: POST /v1/tasks opens one with limits; GET /v1/tasks/{id} shows its books."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import Response

from gateway.accounting.tasks import task_limits
from gateway.errors import InvalidRequest, NotFound
from gateway.pipeline.parse import parse_json_object
from gateway.services import Services

# Each field a client may set, and what it must be.
FIELDS = {"budget_usd": 'an amount of USD from 0 to 1000000, like "2.00"', "max_calls": "a positive integer",
          "max_tokens": "a positive integer", "deadline_s": "a number of seconds, over 0 and at most 86400"}


def build_tasks_router() -> APIRouter:
    router = APIRouter(prefix="/v1/tasks")

    @router.post("")
    async def create_task(request: Request) -> Response:
        services: Services = request.app.state.services
        owner = services.pipeline.identify(request.headers)
        requested = requested_limits(parse_json_object(await request.body() or b"{}"))
        policy = services.policies.current.policy
        try:
            limits = task_limits(requested, policy.tenants[owner.tenant].task_limits, policy.defaults.task_limits)
        except ValidationError as exc:
            error = exc.errors()[0]  # a field the client sent: the policy's own limits were checked at load
            name = str(error["loc"][0])
            raise InvalidRequest(f"`{name}` must be {FIELDS.get(name, 'valid')}: {error['msg']}", param=name) from None
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


def requested_limits(body: dict[str, Any]) -> dict[str, Any]:
    """The limits a client asked for, each checked for its type (the policy's model
    checks the ranges), with the budget as a Decimal."""
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown task fields: {', '.join(unknown)}; allowed: {', '.join(FIELDS)}", param=unknown[0])
    requested: dict[str, Any] = {}
    for name, value in body.items():
        if value is None:
            continue
        money = name == "budget_usd"
        if isinstance(value, bool) or not isinstance(value, (int, float, str) if money else (int, float)):
            raise InvalidRequest(f"`{name}` must be {FIELDS[name]}", param=name)
        if money:
            try:
                value = Decimal(str(value).strip())
            except InvalidOperation:
                raise InvalidRequest(f"`{name}` must be {FIELDS[name]}", param=name) from None
            if not value.is_finite():
                raise InvalidRequest(f"`{name}` must be {FIELDS[name]}", param=name)
        requested[name] = value
    return requested
