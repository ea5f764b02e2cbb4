"""`gateway serve | demo | policy check | keys new | sim` (also `python -m gateway`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.auth.keys import key_digest, new_api_key
from gateway.routing.loader import PolicyInvalid, load_policy_file

STARTUP_FAILURE = 3  # uvicorn's exit status for a server that could not start

if TYPE_CHECKING:
    import uvicorn

    from gateway.accounting.prices import PriceCatalog
    from gateway.app import GatewayApp


def policy_path(args: argparse.Namespace, *, demo: bool = False) -> str | None:
    """--policy, else $GATEWAY_POLICY, else (`demo`: for the report commands) the policy
    of a demo run from this folder, with its simulator key; None (after saying so)
    when there is none."""
    path: str | None = args.policy or os.environ.get("GATEWAY_POLICY")
    if not path and demo:
        from gateway.demo_files import demo_policy_for_reports

        path = demo_policy_for_reports()
    if not path:
        print("error: no policy file: pass --policy FILE or set GATEWAY_POLICY", file=sys.stderr)
    return path or None


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    policy = policy_path(args)
    if policy is None:
        return 2
    catalog = checked_catalog(policy)
    if catalog is None:
        return 1
    from gateway.settings import Settings

    if args.workers > 1 and not Settings().redis_url:
        print(f"error: --workers {args.workers} needs REDIS_URL: without it token buckets, concurrency limits, cooldowns"
              " and caches live inside each worker, so every worker would admit a tenant's whole limit", file=sys.stderr)
        return 2
    os.environ["GATEWAY_POLICY"] = str(Path(policy).resolve())
    if args.workers > 1:
        # Each worker process builds its own app.
        return serve_workers(uvicorn_config("gateway.app:create_app", args))
    from gateway.app import create_app

    # One process: it keeps the prices just read to check the policy (reading litellm's
    # price map again would cost ~0.1 s and a few MB for good).
    server = uvicorn.Server(uvicorn_config(create_app(catalog=catalog), args))
    server.run()
    if not server.started:
        return STARTUP_FAILURE  # as uvicorn.run: it could not start (the port taken, say)
    return 0


def uvicorn_config(app: str | GatewayApp, args: argparse.Namespace) -> uvicorn.Config:
    """`app`: an import string of the app factory (built in each worker process), or the app."""
    import uvicorn

    from gateway.serving.protocol import BoundedHttpProtocol

    return uvicorn.Config(
        app,
        factory=isinstance(app, str),
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http=BoundedHttpProtocol,  # uvicorn's httptools protocol with bounds on the request head
        access_log=False,
        # Nothing here reads the client's address; rewriting it from X-Forwarded-For on
        # every request is a middleware layer for nothing.
        proxy_headers=False,
        log_level=args.log_level,
        timeout_graceful_shutdown=10,
        # Clients pool connections; closing idle ones sooner than they expect races
        # with their next request (75 s, as common proxies do).
        timeout_keep_alive=75,
    )


def serve_workers(config: uvicorn.Config) -> int:
    """uvicorn's own supervisor (it replaces a worker that dies, and stops when one cannot
    start), with the exit status uvicorn.run does not give: STARTUP_FAILURE when the
    workers could not start (the ledger unreachable, say), so that a service manager sees
    a failure rather than a clean stop."""
    from uvicorn.supervisors import Multiprocess

    from gateway import listening
    from gateway.supervision import SUPERVISOR_ENV

    if not listening.supported():
        port = config.bind_socket()  # one socket for all; exits STARTUP_FAILURE itself if the port is taken
    else:
        log = logging.getLogger("uvicorn.error")  # where uvicorn reports its own binding
        try:
            # A socket per worker (gateway/listening.py); the lock stays open until they stop.
            port, _lock = listening.supervisor_socket(config.host, config.port)
        except OSError as exc:
            log.error(exc)
            return STARTUP_FAILURE
        log.info("Gateway running on http://%s:%d, a listening socket per worker", config.host, port.getsockname()[1])
    os.environ[SUPERVISOR_ENV] = str(os.getpid())  # the workers stop if this process dies (gateway/supervision.py)
    supervisor = Multiprocess(config, sockets=[port])
    supervisor.run()
    return STARTUP_FAILURE if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes) else 0


def default_pricing_dir() -> Path:
    from gateway.settings import Settings

    return Settings().gateway_pricing_dir


def check_policy(path: str) -> int:
    """Schema, cross references, and a price for every routable model."""
    return 0 if checked_catalog(path) is not None else 1


def checked_catalog(path: str) -> PriceCatalog | None:
    """`check_policy`, keeping the price catalog it read; None (after printing the
    problems) when the policy or the pricing files are invalid."""
    from gateway.accounting.prices import PriceCatalog, PricingInvalid, every_model_priced

    try:
        catalog = PriceCatalog.load(default_pricing_dir())
    except PricingInvalid as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return None
    try:
        policy = load_policy_file(path, every_model_priced(catalog))
    except PolicyInvalid as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return None
    print(f"{path}: ok ({len(policy.upstreams)} upstreams, {len(policy.models)} models, "
          f"{len(policy.tenants)} tenants, {len(policy.routes)} routes)")
    return catalog


def cmd_policy_check(args: argparse.Namespace) -> int:
    return max(check_policy(path) for path in args.files)


def cmd_policy_schema(args: argparse.Namespace) -> int:
    import json

    from gateway.routing.policy import Policy

    text = json.dumps(Policy.model_json_schema(), indent=2, sort_keys=True) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        print(text, end="")
    return 0


def cmd_pricing_show(args: argparse.Namespace) -> int:
    from datetime import datetime

    from gateway.accounting.prices import show_price

    at = datetime.fromisoformat(args.at) if args.at else None
    code, text = show_price(args.model, args.policy or os.environ.get("GATEWAY_POLICY"), Path(args.pricing_dir or default_pricing_dir()), at)
    print(text, file=sys.stdout if code == 0 else sys.stderr)
    return code


def cmd_reconcile(args: argparse.Namespace) -> int:
    from datetime import UTC, date, datetime

    from gateway.accounting.importers import run_reconcile
    from gateway.settings import Settings

    policy = policy_path(args, demo=True)
    if policy is None:
        return 2
    if args.provider:
        providers = [args.provider]
    else:
        try:  # every hosted upstream: a pool is compared over a live window, which the user asks for by name
            providers = sorted(name for name, upstream in load_policy_file(policy).upstreams.items() if upstream.kind != "vllm")
        except PolicyInvalid as exc:
            print(exc, file=sys.stderr)
            return 2
        if not providers:
            print(f"error: {policy} has no hosted upstream to reconcile; name one with --provider (see --help)", file=sys.stderr)
            return 2
    since = date.fromisoformat(args.since) if args.since else datetime.now(UTC).date().replace(day=1)
    settings = Settings()
    codes, texts = [], []
    for provider in providers:
        code, text = run_reconcile(policy, args.database_url or settings.effective_database_url(), provider, since,
                                   date.fromisoformat(args.until) if args.until else None,
                                   show_progress=not args.quiet, pricing_dir=settings.gateway_pricing_dir)
        codes.append(code)
        texts.append(text)
    print("\n\n".join(texts))
    return max(codes)


def cmd_routes_report(args: argparse.Namespace) -> int:
    from datetime import date

    from gateway.accounting.database import make_engine
    from gateway.accounting.prices import PriceCatalog
    from gateway.accounting.route_report import report_text, route_report
    from gateway.settings import Settings

    policy = policy_path(args, demo=True)
    if policy is None:
        return 2
    settings = Settings()
    engine = make_engine(args.database_url or settings.effective_database_url())
    try:
        report = route_report(engine, load_policy_file(policy), PriceCatalog.load(settings.gateway_pricing_dir),
                              date.fromisoformat(args.since) if args.since else None)
    finally:
        engine.dispose()
    print(report_text(report))
    return 0


def cmd_pool_costs(args: argparse.Namespace) -> int:
    import json
    from datetime import UTC, date, datetime

    from gateway.accounting.database import make_engine
    from gateway.accounting.pool_costs import period, pool_cost_report, pool_upstreams, report_text
    from gateway.accounting.prices import PriceCatalog
    from gateway.settings import Settings

    policy_file = policy_path(args)
    if policy_file is None:
        return 2
    settings = Settings()
    policy = load_policy_file(policy_file)
    try:
        start, end = period(date.fromisoformat(args.since), date.fromisoformat(args.until) if args.until else None, datetime.now(UTC))
        names = list(pool_upstreams(policy, args.upstream))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = make_engine(args.database_url or settings.effective_database_url())
    try:
        catalog = PriceCatalog.load(settings.gateway_pricing_dir)
        reports = [pool_cost_report(engine, policy, catalog, name, start, end) for name in names]
    finally:
        engine.dispose()
    print(json.dumps(reports, indent=2) if args.json else report_text(reports))
    return 0


def cmd_keys_new(args: argparse.Namespace) -> int:
    key = new_api_key()
    print(f"API key for tenant `{args.tenant}` (shown once; give it to the application):\n  {key}\n")
    print("Add this line under the tenant's `api_keys:` in the policy:")
    print(f'  - "{key_digest(key)}"')
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo

    return run_demo(args)


def _ledger_options(parser: argparse.ArgumentParser, *, demo: bool) -> None:
    """--policy and --database-url, for the commands that read the ledger (`demo`: the
    policy falls back to a demo's, as `policy_path(demo=True)` does)."""
    fallback = ", else a demo's in var/demo/" if demo else ""
    parser.add_argument("--policy", help=f"policy YAML (default: $GATEWAY_POLICY{fallback})")
    parser.add_argument("--database-url", help="ledger database (default: $DATABASE_URL or the SQLite file under var/)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description="Cost-aware OpenAI-compatible model gateway")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--policy", help="policy YAML (default: $GATEWAY_POLICY)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--workers", type=int, default=1)
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=cmd_serve)

    demo = sub.add_parser("demo", help="run the simulators and a gateway in front of them")
    demo.add_argument("--port", type=int, default=8080)
    demo.add_argument("--hosted-port", type=int, default=9100)
    demo.add_argument("--vllm-port", type=int, default=9200)
    demo.add_argument("--anthropic-port", type=int, default=9300)
    demo.set_defaults(func=cmd_demo)

    policy = sub.add_parser("policy", help="policy file tools")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    check = policy_sub.add_parser("check", help="validate policy files; exit 1 with the problems")
    check.add_argument("files", nargs="+")
    check.set_defaults(func=cmd_policy_check)

    schema = policy_sub.add_parser("schema", help="print the policy JSON Schema (for editors)")
    schema.add_argument("--output", help="write to this file instead of stdout")
    schema.set_defaults(func=cmd_policy_schema)

    pricing = sub.add_parser("pricing", help="the price catalog")
    pricing_sub = pricing.add_subparsers(dest="pricing_command", required=True)
    show = pricing_sub.add_parser("show", help="the price in effect for a model, and where it comes from")
    show.add_argument("model")
    show.add_argument("--policy", help="use this policy's price and upstream_model (default: $GATEWAY_POLICY)")
    show.add_argument("--pricing-dir", help="pricing overrides folder (default: the bundled pricing/)")
    show.add_argument("--at", help="ISO date-time to price at (default: now)")
    show.set_defaults(func=cmd_pricing_show)

    reconcile = sub.add_parser("reconcile", help="compare the ledger with what a provider billed")
    reconcile.add_argument("--provider",
                           help="an upstream name from the policy, vllm:UPSTREAM[@SECONDS], csv:[UPSTREAM:]PATH or anthropic:[UPSTREAM:]PATH"
                                " (default: each hosted upstream of the policy)")
    reconcile.add_argument("--since", help="first day, YYYY-MM-DD (default: the first of this month, UTC)")
    reconcile.add_argument("--until", help="day after the last, YYYY-MM-DD (default: through today)")
    _ledger_options(reconcile, demo=True)
    reconcile.add_argument("--quiet", action="store_true", help="no progress bar")
    reconcile.set_defaults(func=cmd_reconcile)

    routes = sub.add_parser("routes", help="routing reports")
    routes_sub = routes.add_subparsers(dest="routes_command", required=True)
    report = routes_sub.add_parser("report", help="per route: escalation rate by reason, cost per successful request")
    _ledger_options(report, demo=True)
    report.add_argument("--since", help="first day, YYYY-MM-DD")
    report.set_defaults(func=cmd_routes_report)

    pool = sub.add_parser("pool", help="self-hosted pools")
    pool_sub = pool.add_subparsers(dest="pool_command", required=True)
    costs = pool_sub.add_parser("costs", help="a pool's whole GPU cost split to tenants, idle and recovery shown")
    costs.add_argument("--since", required=True, help="first day, YYYY-MM-DD (from 00:00 UTC)")
    costs.add_argument("--until", help="day after the last, YYYY-MM-DD (default: until now)")
    costs.add_argument("--upstream", help="the pool's upstream name (default: every vLLM upstream)")
    _ledger_options(costs, demo=False)
    costs.add_argument("--json", action="store_true", help="JSON instead of a table")
    costs.set_defaults(func=cmd_pool_costs)

    keys = sub.add_parser("keys", help="API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    new = keys_sub.add_parser("new", help="mint a key and print its policy line")
    new.add_argument("--tenant", required=True)
    new.set_defaults(func=cmd_keys_new)

    from gateway.sim.cli import add_sim_commands

    add_sim_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per upstream call is noise, and costs
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
