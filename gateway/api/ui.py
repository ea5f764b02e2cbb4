"""The finance dashboard's HTTP side (`/ui/`): sign-in with the admin key, the session
cookie, and the pages and CSV downloads, each refused without a valid session.

The admin key travels once, in the body of the sign-in POST, and never in a URL. The
browser then holds a signed, expiring session token (gateway/ui/sessions.py) in a
cookie that scripts cannot read (HttpOnly), that other sites' pages and links do not
send (SameSite=Strict), and that is Secure when the request came over HTTPS."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

import anyio
from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from gateway.caching.salts import load_or_create_secret
from gateway.services import Services
from gateway.ui import pages
from gateway.ui.figures import Month
from gateway.ui.render import Pages
from gateway.ui.sessions import COOKIE, Revocations, Session, SessionKeys

log = logging.getLogger("gateway.ui")
MAX_FORM_BYTES = 8192
# No scripts at all; styles and images from the gateway only; forms post back to it;
# never framed (clickjacking).
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


@dataclass
class Dashboard:
    """What the routes share, built on the first request (the services live on the app)."""

    keys: SessionKeys
    revocations: Revocations
    pages: Pages


class DashboardHolder:
    def __init__(self) -> None:
        self._built: Dashboard | None = None
        self._pages: Pages | None = None

    def pages(self) -> Pages:
        if self._pages is None:
            self._pages = Pages()
        return self._pages

    def get(self, services: Services) -> Dashboard | None:
        """None while the admin API is disabled (no GATEWAY_ADMIN_KEY)."""
        settings = services.settings
        if not settings.gateway_admin_key:
            return None
        if self._built is None:
            secret = load_or_create_secret(settings.gateway_secret, settings.gateway_var_dir)
            self._built = Dashboard(SessionKeys(secret, settings.gateway_admin_key),
                                    Revocations(services.redis, settings.gateway_redis_prefix), self.pages())
        return self._built

    def disabled(self) -> Response:
        return _page(self.pages(), "sign_in.html", 403, disabled=True, error=None)


def build_ui_router() -> APIRouter:
    router = APIRouter(prefix="/ui")
    holder = DashboardHolder()

    async def session_of(request: Request, dash: Dashboard) -> Session | None:
        session = dash.keys.verify(request.cookies.get(COOKIE, ""))
        if session is None:
            return None
        try:
            revoked = await dash.revocations.revoked(session)
        except Exception:  # Redis down: this replica's own sign-outs still count; the expiry bounds the rest
            log.warning("could not read signed-out dashboard sessions from Redis", exc_info=True)
            revoked = False
        return None if revoked else session

    async def signed_in(request: Request) -> tuple[Services, Dashboard] | Response:
        """The services and dashboard for a request with a valid session, else the
        response that refuses it (no figures in it)."""
        services: Services = request.app.state.services
        dash = holder.get(services)
        if dash is None:
            return holder.disabled()
        if await session_of(request, dash) is None:
            return _page(dash.pages, "sign_in.html", 401, disabled=False, error="Sign in to see this page.")
        await services.accounting.flush()  # calls already answered are in the books first
        return services, dash

    @router.get("", include_in_schema=False)
    async def no_slash() -> Response:
        return RedirectResponse("/ui/", status_code=308)

    @router.get("/")
    async def home(request: Request) -> Response:
        services: Services = request.app.state.services
        dash = holder.get(services)
        if dash is None:
            return holder.disabled()
        if await session_of(request, dash) is None:
            return _page(dash.pages, "sign_in.html", 200, disabled=False, error=None)
        await services.accounting.flush()
        now = datetime.now(UTC)
        q = request.query_params
        month, tenant = Month.parse(q.get("month"), now), q.get("tenant") or None
        context = await anyio.to_thread.run_sync(pages.dashboard, services.reader, services.policies.current.policy,
                                                 services.accounting.catalog, month, tenant, now)
        return _page(dash.pages, "dashboard.html", 200, signed_in=True, **context)

    @router.post("/sign-in")
    async def sign_in(request: Request) -> Response:
        services: Services = request.app.state.services
        dash = holder.get(services)
        if dash is None:
            return holder.disabled()
        presented = await _form_field(request, "admin_key")
        if presented is None or not dash.keys.key_matches(presented):
            return _page(dash.pages, "sign_in.html", 401, disabled=False, error="That is not this gateway's admin key.")
        response = RedirectResponse("/ui/", status_code=303)
        response.set_cookie(COOKIE, dash.keys.issue(), max_age=dash.keys.ttl_s, path="/ui", httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return _secured(response)

    @router.post("/sign-out")
    async def sign_out(request: Request) -> Response:
        services: Services = request.app.state.services
        dash = holder.get(services)
        if dash is not None and (session := dash.keys.verify(request.cookies.get(COOKIE, ""))) is not None:
            await dash.revocations.revoke(session)
        response = RedirectResponse("/ui/", status_code=303)
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict", secure=request.url.scheme == "https")
        return _secured(response)

    @router.get("/export/{table}.csv")
    async def export(request: Request, table: str) -> Response:
        allowed = await signed_in(request)
        if isinstance(allowed, Response):
            return allowed
        services, _ = allowed
        now = datetime.now(UTC)
        q = request.query_params
        month, tenant = Month.parse(q.get("month"), now), q.get("tenant") or None
        if table == "reconcile":
            return await _reconcile_csv(services, q.get("provider", ""), month, now)
        if table not in pages.TABLES:
            return _secured(Response(f"no table `{table}`; choose from {', '.join(pages.TABLES)}\n", 404, media_type="text/plain"))
        body = await anyio.to_thread.run_sync(pages.table_csv, services.reader, table, month, tenant)
        return _csv(body, f"{table}-{month.key}{'-' + tenant if tenant else ''}.csv")

    @router.get("/reconcile")
    async def reconcile(request: Request) -> Response:
        allowed = await signed_in(request)
        if isinstance(allowed, Response):
            return allowed
        services, dash = allowed
        now = datetime.now(UTC)
        month = Month.parse(request.query_params.get("month"), now)
        policy = services.policies.current.policy
        sections = [await _provider_section(services, name, month, now) for name in pages.hosted_upstreams(policy)]
        until = pages.reconcile_window(month, now)[1]
        return _page(dash.pages, "reconcile.html", 200, signed_in=True, month=month, tenant=None, providers=sections,
                     pools=pages.pool_upstreams(policy), until=until)

    @router.get("/tasks/{task_id}")
    async def task(request: Request, task_id: str) -> Response:
        allowed = await signed_in(request)
        if isinstance(allowed, Response):
            return allowed
        services, dash = allowed
        info = await services.accounting.tasks.get(task_id)
        if info is None:
            return _secured(Response(f"no task `{task_id}`\n", 404, media_type="text/plain"))
        books = await services.accounting.tasks.books(info)
        return _page(dash.pages, "task.html", 200, signed_in=True, month=Month.containing(datetime.now(UTC)), tenant=info.tenant,
                     books=books)

    @router.get("/static/ui.css")
    async def style_sheet() -> Response:
        return Response(holder.pages().style_sheet, media_type="text/css",
                        headers={"cache-control": "no-cache", "x-content-type-options": "nosniff"})

    return router


async def _provider_section(services: Services, name: str, month: Month, now: datetime) -> dict[str, Any]:
    report, error = await _reconcile(services, name, month, now)
    return pages.provider_section(name, report, error, month, now)


async def _reconcile(services: Services, provider: str, month: Month, now: datetime) -> tuple[dict[str, Any] | None, str | None]:
    # Imported here, as the admin API does: the importers are only for reconciliation.
    from gateway.accounting.importers import reconcile_upstream
    from gateway.accounting.prices import PricingInvalid
    from gateway.accounting.reconcile import ImportFailed

    since, until = pages.reconcile_window(month, now)
    try:
        report = await reconcile_upstream(services.reader, services.policies.current.policy, provider, since, until,
                                          catalog=services.accounting.catalog)
    except (ValueError, ImportFailed) as exc:
        return None, f"The provider's usage report could not be read: {exc}"
    except PricingInvalid as exc:
        return None, f"Prices could not be read: {'; '.join(exc.problems)}"
    return report, None


async def _reconcile_csv(services: Services, provider: str, month: Month, now: datetime) -> Response:
    from gateway.accounting.finance import reconciliation_to_csv

    if provider not in pages.hosted_upstreams(services.policies.current.policy):
        return _secured(Response(f"no hosted upstream `{provider}` in the policy\n", 404, media_type="text/plain"))
    report, error = await _reconcile(services, provider, month, now)
    if report is None:
        return _secured(Response(f"{error}\n", 502, media_type="text/plain"))
    return _csv(reconciliation_to_csv(report), f"reconcile-{provider}-{month.key}.csv")


async def _form_field(request: Request, name: str) -> str | None:
    """One field of a small urlencoded form; None for anything else."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    try:
        values = parse_qs(body.decode("utf-8", "replace"), max_num_fields=8).get(name)
    except ValueError:  # more fields than a sign-in form has
        return None
    return values[0] if values else None


def _page(renderer: Pages, template: str, status: int, **context: Any) -> Response:
    context.setdefault("signed_in", False)
    context.setdefault("month", None)
    context.setdefault("tenant", None)
    return _secured(Response(renderer.render(template, **context), status, media_type="text/html; charset=utf-8"))


def _csv(body: str, filename: str) -> Response:
    return _secured(Response(body, media_type="text/csv; charset=utf-8",
                             headers={"content-disposition": f'attachment; filename="{filename}"'}))


def _secured(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response
