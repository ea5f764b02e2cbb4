"""Admin API (bearer GATEWAY_ADMIN_KEY): finance reads and ledger operations."""

from __future__ import annotations

from datetime import UTC, date, datetime

import anyio
import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.accounting.finance import reconciliation_to_csv, task_rows, tasks_to_csv
from gateway.accounting.reports import cost_rows, parse_group_by, rows_to_csv
from gateway.accounting.route_report import route_report
from gateway.auth.keys import bearer_matches
from gateway.errors import AuthenticationFailed, GatewayError, InvalidRequest, PermissionDenied, UpstreamError
from gateway.services import Services


def admin_services(request: Request) -> Services:
    services: Services = request.app.state.services
    expected = services.settings.gateway_admin_key
    if not expected:
        raise PermissionDenied("the admin API is disabled: set GATEWAY_ADMIN_KEY to enable it")
    if not bearer_matches(request.headers.get("authorization", ""), expected):
        raise AuthenticationFailed("the admin API needs `Authorization: Bearer <GATEWAY_ADMIN_KEY>`")
    return services


async def books_services(request: Request) -> Services:
    """The services, for a handler that reads the ledger: answered calls whose
    settlement is still committing in the background are in the books first."""
    services = admin_services(request)
    await services.accounting.flush()
    return services


def _day(value: str | None, name: str) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value[:10])
    except ValueError:
        raise InvalidRequest(f"`{name}` must be a date like 2026-11-01", param=name) from None


def wants_csv(request: Request) -> bool:
    return request.query_params.get("format") == "csv" or "text/csv" in request.headers.get("accept", "")


def build_admin_router() -> APIRouter:
    router = APIRouter(prefix="/admin")

    @router.get("/costs")
    async def costs(request: Request) -> Response:
        services = await books_services(request)
        q = request.query_params
        try:
            group_by = parse_group_by(q.get("group_by"))
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="group_by") from None
        since, until = _day(q.get("from"), "from"), _day(q.get("to"), "to")
        rows = await anyio.to_thread.run_sync(cost_rows, services.reader, group_by, since, until, q.get("tenant"))
        if wants_csv(request):
            return Response(rows_to_csv(rows, group_by), media_type="text/csv")
        return Response(orjson.dumps({"rows": rows}), media_type="application/json")

    @router.get("/reconcile")
    async def reconcile(request: Request) -> Response:
        services = await books_services(request)
        q = request.query_params
        provider, since = q.get("provider"), _day(q.get("since"), "since")
        if not provider or since is None:
            raise InvalidRequest("`provider` (an upstream name, csv:PATH, ...) and `since` (a date) are required")
        # Imported here: the importers cost ~0.1 s of start-up and only reconciliation needs them.
        from gateway.accounting.importers import reconcile_upstream
        from gateway.accounting.prices import PricingInvalid
        from gateway.accounting.reconcile import ImportFailed

        try:
            report = await reconcile_upstream(services.reader, services.policies.current.policy, provider, since,
                                              _day(q.get("until"), "until"), catalog=services.accounting.catalog)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        except ImportFailed as exc:
            raise UpstreamError(f"the provider's usage report could not be read: {exc}") from None
        except PricingInvalid as exc:
            raise GatewayError(f"prices could not be read: {'; '.join(exc.problems)}") from None
        if wants_csv(request):
            return Response(reconciliation_to_csv(report), media_type="text/csv")
        return Response(orjson.dumps(report), media_type="application/json")

    @router.get("/tasks")
    async def task_books(request: Request) -> Response:
        """Tasks opened in [from, to) (UTC days), newest first, with their books."""
        services = await books_services(request)
        q = request.query_params
        since, until = _day(q.get("from"), "from"), _day(q.get("to"), "to")
        rows = await anyio.to_thread.run_sync(task_rows, services.reader, since, until, q.get("tenant"))
        if wants_csv(request):
            return Response(tasks_to_csv(rows), media_type="text/csv")
        return Response(orjson.dumps({"rows": rows}), media_type="application/json")

    @router.get("/routes")
    async def routes(request: Request) -> Response:
        services = await books_services(request)
        since = _day(request.query_params.get("since"), "since")
        report = await anyio.to_thread.run_sync(route_report, services.reader, services.policies.current.policy,
                                                services.accounting.catalog, since)
        return Response(orjson.dumps(report), media_type="application/json")

    @router.get("/pool")
    async def pool(request: Request) -> Response:
        """Each self-hosted pool as this gateway replica sees it now (replicas' health,
        load, KV use, prefix-cache hit rate, recent tenants, why requests went where
        they went), and from the ledger its cost split to tenants over `since` (default:
        today, UTC) until `until` (default: now)."""
        services = await books_services(request)
        q = request.query_params
        since = _day(q.get("since"), "since") or datetime.now(UTC).date()
        from gateway.accounting.pool_costs import period, pool_cost_report

        try:
            start, end = period(since, _day(q.get("until"), "until"), datetime.now(UTC))
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="until") from None
        policy = services.policies.current.policy
        pools = []
        for upstream in services.upstreams.pools():
            assert upstream.pool is not None
            view = upstream.pool.snapshot()
            if upstream.name in policy.upstreams:
                view["costs"] = await anyio.to_thread.run_sync(pool_cost_report, services.reader, policy, services.accounting.catalog,
                                                               upstream.name, start, end)
            pools.append(view)
        return Response(orjson.dumps({"pools": pools}), media_type="application/json")

    @router.get("/prompt-hygiene")
    async def prompt_hygiene(request: Request) -> Response:
        """Per tenant: how many prompts start with volatile text that defeats prefix caching."""
        services = admin_services(request)
        services.accounting.deferred.run()  # the prompts still waiting to be looked at
        return Response(orjson.dumps(services.pipeline.parts.hygiene.report()), media_type="application/json")

    @router.post("/sweep")
    async def sweep(request: Request) -> Response:
        services = await books_services(request)
        expired = await services.sweep()
        return Response(orjson.dumps({"expired": expired}), media_type="application/json")

    return router
