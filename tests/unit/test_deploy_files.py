"""The deployment files agree with the code: compose stack, image, Prometheus and Grafana
config, dashboards, and the policies they ship.

Docker is not needed: compose.yaml is read as YAML with its `${VAR:-default}` values
resolved to their defaults (what a plain `docker compose up` uses), dashboard PromQL is
checked against the metrics `gateway.telemetry.metrics.Metrics` registers and vLLM's
documented names, and the finance SQL runs against the real ledger schema in PostgreSQL.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.accounting.prices import PriceCatalog, every_model_priced
from gateway.routing.loader import load_policy_file, parse_policy
from gateway.telemetry.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DASHBOARDS = ROOT / "dashboards" / "grafana" / "dashboards"
PROVISIONING = ROOT / "dashboards" / "grafana" / "provisioning"
LAUNCH = ROOT / "selfhosted" / "launch" / "vllm-replica.sh"
POLICIES = [ROOT / "policies" / "compose.yaml", ROOT / "selfhosted" / "pool.example.yaml"]

# vLLM's metric names as ../shared/reference/PROTOCOLS.md lists them (V1 engine; labels
# model_name, engine). Counters are exported with `_total`, histograms as _bucket/_sum/_count.
VLLM_GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
VLLM_COUNTERS = [
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total", "vllm:request_success_total", "vllm:num_preemptions_total",
]
VLLM_HISTOGRAMS = [
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
]
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# Labels a dashboard may group by: each has a small, policy-bounded or fixed set of values.
BOUNDED_LABELS = {"status", "model", "upstream", "outcome", "kind", "result", "le", "instance", "job", "pool",
                  "model_name", "finished_reason"}

PROMQL_WORDS = {
    # aggregations and their modifiers
    "sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
    # functions
    "rate", "irate", "increase", "delta", "idelta", "deriv", "histogram_quantile", "abs", "ceil", "floor", "round",
    "clamp", "clamp_min", "clamp_max", "vector", "scalar", "time", "timestamp", "absent", "sort", "sort_desc",
    "label_replace", "label_join", "changes", "resets", "predict_linear", "sum_over_time", "avg_over_time",
    "max_over_time", "min_over_time", "count_over_time", "last_over_time", "quantile_over_time", "absent_over_time",
}
GRAFANA_SQL_MACROS = {"$__timeFilter(", "$__timeFrom()", "$__timeTo()"}
LEDGER_TABLES = {"usage_events", "budgets", "reservations", "tasks"}


# ---------------------------------------------------------------- helpers

def _interpolate(value: Any) -> Any:
    """Resolve compose `${VAR:-default}`, `${VAR-default}` and `${VAR}` to the default."""
    if isinstance(value, str):
        return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)
    if isinstance(value, dict):
        return {k: _interpolate(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v) for v in value]
    return value


def compose() -> dict[str, Any]:
    data = _interpolate(yaml.safe_load(COMPOSE.read_text()))
    assert isinstance(data, dict)
    return data


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


def env(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {k: "" if v is None else str(v) for k, v in raw.items()}


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each short-syntax volume; a source is a host path or a volume name."""
    out = []
    for item in service.get("volumes") or []:
        parts = item.split(":")
        out.append((parts[0], parts[1]))
    return out


def host_path(service: dict[str, Any], container_path: str) -> Path:
    """The repository file a bind mount puts at `container_path`."""
    target = PurePosixPath(container_path)
    for source, mount_target in mounts(service):
        if source.startswith((".", "/")) and (target == PurePosixPath(mount_target) or PurePosixPath(mount_target) in target.parents):
            rest = target.relative_to(mount_target)
            return (ROOT / source / rest).resolve()
    raise AssertionError(f"nothing is mounted at {container_path}")


def gateway_services() -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in services().items() if command(svc)[:2] == ["gateway", "serve"]}


def catalog() -> PriceCatalog:
    return PriceCatalog.load(ROOT / "pricing")


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # panels inside a collapsed row
    return out


def targets(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(panel["title"], t) for panel in panels(dashboard) if panel["type"] != "row" for t in panel.get("targets", [])]


def promql_metric_names(expr: str) -> list[str]:
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range selectors
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    words = re.findall(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", s)
    return [w for w in words if w not in PROMQL_WORDS]


def known_series() -> set[str]:
    """Every series name the gateway's registry exports, plus vLLM's."""
    names: set[str] = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + suffix for suffix in HISTOGRAM_SUFFIXES)
        else:
            names.add(family.name)
    names.update(VLLM_GAUGES)
    names.update(VLLM_COUNTERS)
    names.update(h + suffix for h in VLLM_HISTOGRAMS for suffix in HISTOGRAM_SUFFIXES)
    return names


def prometheus_exprs() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable on a Prometheus datasource."""
    out = []
    for name, dash in dashboards().items():
        for title, target in targets(dash):
            if "expr" in target:
                out.append((f"{name}: {title}", target["expr"]))
        for var in dash.get("templating", {}).get("list", []):
            if var.get("datasource", {}).get("type") == "prometheus":
                query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                match = re.fullmatch(r"label_values\(\s*([^,]+?)\s*,\s*(\w+)\s*\)", query)
                assert match, f"{name}: variable {var['name']}: expected label_values(metric, label), got {query}"
                out.append((f"{name}: variable {var['name']}", match.group(1)))
    return out


def sql_targets() -> list[tuple[str, str]]:
    return [(f"{name}: {title}", t["rawSql"]) for name, dash in dashboards().items() for title, t in targets(dash) if "rawSql" in t]


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


# ---------------------------------------------------------------- compose

def test_compose_has_every_service_the_stack_needs() -> None:
    found = services()
    for name in ("redis", "postgres", "prometheus", "grafana", "sim-hosted", "sim-vllm", "vllm"):
        assert name in found, f"compose.yaml has no `{name}` service"
    assert found["redis"]["image"].startswith("redis:7")
    assert found["postgres"]["image"].startswith("postgres:16")
    assert found["vllm"]["image"].startswith("vllm/vllm-openai:")
    assert command(found["sim-hosted"])[:3] == ["gateway", "sim", "hosted"]
    assert command(found["sim-vllm"])[:3] == ["gateway", "sim", "vllm"]
    for name in ("sim-hosted", "sim-vllm"):
        assert flag(command(found[name]), "--host") == "0.0.0.0", f"{name} must listen beyond its own container"


def test_two_gateway_replicas_share_postgres_and_redis() -> None:
    all_services = services()
    gateways = gateway_services()
    replicas = sum(int(svc.get("deploy", {}).get("replicas", 1)) for svc in gateways.values())
    assert replicas >= 2, f"expected at least two gateway replicas, found {sorted(gateways)}"
    pg_env = env(all_services["postgres"])
    published: list[str] = []
    for name, svc in gateways.items():
        cmd = command(svc)
        assert flag(cmd, "--host") == "0.0.0.0"
        port = flag(cmd, "--port")
        e = env(svc)
        db = urlsplit(e["DATABASE_URL"])
        assert db.scheme == "postgresql", f"{name}: DATABASE_URL must be a postgresql:// URL"
        assert (db.hostname, db.port) == ("postgres", 5432), f"{name}: DATABASE_URL must point at the postgres service"
        assert db.username == pg_env["POSTGRES_USER"] and db.password == pg_env["POSTGRES_PASSWORD"]
        assert db.path == "/" + pg_env["POSTGRES_DB"]
        redis = urlsplit(e["REDIS_URL"])
        assert (redis.scheme, redis.hostname) == ("redis", "redis"), f"{name}: REDIS_URL must point at the redis service"
        depends = svc["depends_on"]
        for needed in ("postgres", "redis"):
            assert depends[needed]["condition"] == "service_healthy", f"{name} must wait for a healthy {needed}"
        published += [p.rsplit(":", 1)[0] for p in svc.get("ports", []) if p.endswith(":" + port)]
    assert len(set(published)) == len(published), "two gateway replicas publish the same host port"


def test_gateway_replicas_share_one_secret() -> None:
    """Cache salts and cache keys derive from GATEWAY_SECRET: replicas must agree on it."""
    gateways = list(gateway_services().values())
    secrets = {env(svc)["GATEWAY_SECRET"] for svc in gateways}
    assert len(secrets) == 1
    if secrets == {""}:  # unset: the file under GATEWAY_VAR_DIR, so one shared named volume
        var_volumes = set()
        for svc in gateways:
            var_dir = env(svc)["GATEWAY_VAR_DIR"]
            var_volumes |= {source for source, target in mounts(svc) if target == var_dir and not source.startswith((".", "/"))}
            assert svc["depends_on"]["gateway-secret"]["condition"] == "service_completed_successfully"
        assert len(var_volumes) == 1, "every gateway replica must mount the same volume at GATEWAY_VAR_DIR"
        assert var_volumes <= set(compose()["volumes"])


def test_gateway_policy_is_the_mounted_compose_policy_and_reaches_the_simulators() -> None:
    all_services = services()
    for name, svc in gateway_services().items():
        policy_file = host_path(svc, env(svc)["GATEWAY_POLICY"])
        assert policy_file == ROOT / "policies" / "compose.yaml", name
        policy = load_policy_file(policy_file, every_model_priced(catalog()))
        for upstream_name, upstream in policy.upstreams.items():
            for url in upstream.urls():
                parts = urlsplit(url)
                assert parts.hostname in all_services, f"upstream {upstream_name}: {parts.hostname} is not a compose service"
                target = all_services[parts.hostname]
                assert str(parts.port) == flag(command(target), "--port"), f"upstream {upstream_name}: wrong port"
                assert "profiles" not in target, f"upstream {upstream_name} needs an optional profile to run"
            if upstream.api_key_env:
                assert env(svc).get(upstream.api_key_env), f"{name} does not set {upstream.api_key_env}"


def test_postgres_has_a_healthcheck_and_a_named_volume() -> None:
    pg = services()["postgres"]
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    named = [source for source, target in mounts(pg) if target == "/var/lib/postgresql/data"]
    assert named and named[0] in compose()["volumes"]


def test_dependencies_exist_and_waited_for_health_has_a_healthcheck() -> None:
    all_services = services()
    image_has_healthcheck = {"cost-gateway:local"}  # the Dockerfile's HEALTHCHECK
    for name, svc in all_services.items():
        depends = svc.get("depends_on") or {}
        conditions = depends if isinstance(depends, dict) else {dep: {"condition": "service_started"} for dep in depends}
        for dep, cond in conditions.items():
            assert dep in all_services, f"{name} depends on unknown service {dep}"
            assert "profiles" not in all_services[dep], f"{name} depends on {dep}, which runs only under a profile"
            if cond["condition"] == "service_healthy":
                target = all_services[dep]
                assert "healthcheck" in target or target.get("image") in image_has_healthcheck, f"{dep} has no healthcheck"


def test_vllm_runs_under_the_gpu_profile_with_the_launch_script() -> None:
    vllm = services()["vllm"]
    assert vllm["profiles"] == ["gpu"]
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    selfhosted = [target for source, target in mounts(vllm) if Path(ROOT / source).resolve() == ROOT / "selfhosted"]
    assert selfhosted, "the vllm service must mount selfhosted/"
    assert host_path(vllm, vllm["entrypoint"][-1]) == LAUNCH
    assert env(vllm)["POOL_PORT"] == "8000"


# ---------------------------------------------------------------- the launch script

def _launch(extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    assert bash is not None
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "POOL_DRY_RUN": "1"}
    return subprocess.run([bash, str(LAUNCH)], env={**base, **extra_env}, capture_output=True, text=True, timeout=30)


def test_launch_script_passes_the_flags_the_gateway_relies_on() -> None:
    result = _launch({"POOL_MODEL": "Qwen/Qwen2.5-7B-Instruct", "POOL_SERVED_NAME": "qwen-7b", "POOL_PORT": "8001",
                      "POOL_MAX_MODEL_LEN": "8192", "POOL_EXTRA_ARGS": "--max-num-seqs 64"})
    assert result.returncode == 0, result.stderr
    args = result.stdout.split()
    assert args[:3] == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"]
    for needed in ("--enable-prompt-tokens-details", "--enable-prefix-caching", "--enable-server-load-tracking"):
        assert needed in args
    assert flag(args, "--served-model-name") == "qwen-7b"
    assert flag(args, "--port") == "8001"
    assert flag(args, "--max-model-len") == "8192"
    assert flag(args, "--max-num-seqs") == "64"


def test_launch_script_switches_and_refuses_without_a_model() -> None:
    result = _launch({"POOL_MODEL": "m", "POOL_PREFIX_CACHING": "0", "POOL_LOAD_TRACKING": "0"})
    args = result.stdout.split()
    assert "--no-enable-prefix-caching" in args and "--enable-server-load-tracking" not in args
    assert flag(args, "--served-model-name") == "m"
    missing = _launch({})
    assert missing.returncode != 0 and "POOL_MODEL" in missing.stderr


def test_shell_scripts_parse() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    for script in [LAUNCH, *sorted((ROOT / "dashboards" / "postgres-init").glob("*.sh"))]:
        result = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, f"{script}: {result.stderr}"


# ---------------------------------------------------------------- policies

@pytest.mark.parametrize("path", POLICIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_policies_load_with_every_model_priced(path: Path) -> None:
    policy = load_policy_file(path, every_model_priced(catalog()))
    assert policy.tenants
    for name, model in policy.models.items():
        assert model.price is not None, f"{path.name}: model {name} has no price"


def test_pool_example_has_a_two_replica_pool() -> None:
    policy = load_policy_file(ROOT / "selfhosted" / "pool.example.yaml")
    pools = [u for u in policy.upstreams.values() if u.kind == "vllm"]
    assert pools and len(pools[0].urls()) == 2


def test_compose_policy_gpu_upstream_is_valid_when_uncommented() -> None:
    lines = (ROOT / "policies" / "compose.yaml").read_text().splitlines()
    out, uncommenting = [], False
    for line in lines:
        if line in ("  # gpu:", "  # gpu-model:"):
            uncommenting = True
        elif not line.startswith("  #   "):
            uncommenting = False
        out.append("  " + line[4:] if uncommenting else line)
    policy = parse_policy("\n".join(out) + "\n", "compose.yaml (gpu uncommented)", every_model_priced(catalog()))
    assert policy.upstreams["gpu"].urls() == ["http://vllm:8000/v1"]
    assert policy.models["gpu-model"].upstream == "gpu"
    vllm_env = env(services()["vllm"])
    assert vllm_env["POOL_SERVED_NAME"] == (policy.models["gpu-model"].upstream_model or "gpu-model")


# ---------------------------------------------------------------- image

def test_dockerfile_builds_a_non_root_image_from_the_hashed_lock() -> None:
    instructions = dockerfile_instructions()
    text = " ".join(f"{op} {rest}" for op, rest in instructions)
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in text
    assert all(rest.split()[0] == "${PYTHON_IMAGE}" for op, rest in instructions if op == "FROM")
    assert "pip install --require-hashes --no-deps -r requirements.lock" in text
    users = [rest for op, rest in instructions if op == "USER"]
    assert users and not users[-1].startswith(("root", "0")), "the image must run as a non-root user"
    assert ("EXPOSE", "8080") in instructions
    health = [rest for op, rest in instructions if op == "HEALTHCHECK"]
    assert health and "/healthz" in health[0]
    cmd = json.loads(next(rest for op, rest in reversed(instructions) if op == "CMD"))
    assert cmd[:2] == ["gateway", "serve"] and flag(cmd, "--host") == "0.0.0.0" and flag(cmd, "--port") == "8080"
    env_line = " ".join(rest for op, rest in instructions if op == "ENV")
    assert "GATEWAY_PRICING_DIR=/app/pricing" in env_line  # the package is installed, not run from the tree


def test_dockerignore_lets_in_exactly_what_the_dockerfile_copies() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*", ".dockerignore is an allow-list"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for op, rest in dockerfile_instructions():
        if op == "COPY" and not rest.startswith("--from"):
            *sources, _dest = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: no such path"
                assert source in allowed, f"COPY {source} is excluded by .dockerignore"
    for secret_place in (".git", ".venv", "var", ".env", "tests"):
        assert secret_place not in allowed


# ---------------------------------------------------------------- prometheus and grafana

def test_prometheus_scrapes_the_gateways_and_the_pool() -> None:
    all_services = services()
    prom = all_services["prometheus"]
    config_file = next(arg.split("=", 1)[1] for arg in command(prom) if arg.startswith("--config.file="))
    assert host_path(prom, config_file) == ROOT / "dashboards" / "prometheus.yml"
    config = yaml.safe_load((ROOT / "dashboards" / "prometheus.yml").read_text())
    scraped = {t for job in config["scrape_configs"] for sc in job.get("static_configs", []) for t in sc["targets"]}
    for name, svc in gateway_services().items():
        assert f"{name}:{flag(command(svc), '--port')}" in scraped
    assert f"sim-vllm:{flag(command(all_services['sim-vllm']), '--port')}" in scraped
    assert f"vllm:{env(all_services['vllm'])['POOL_PORT']}" in scraped
    for target in scraped:
        host = target.split(":")[0]
        assert host == "localhost" or host in all_services, f"scrape target {target} is not a compose service"


def test_prometheus_scrapes_the_gateways_with_their_metrics_key() -> None:
    """Without the key a gateway answers 401 (tests/e2e/test_nothing_leaks.py): the
    scrape job must send what the gateways expect."""
    keys = {env(svc).get("GATEWAY_METRICS_KEY", "") for svc in gateway_services().values()}
    assert len(keys) == 1 and "" not in keys, "every gateway replica takes the same, non-empty metrics key"
    config = yaml.safe_load((ROOT / "dashboards" / "prometheus.yml").read_text())
    job = next(job for job in config["scrape_configs"] if job["job_name"] == "gateway")
    authorization = job["authorization"]
    assert authorization["type"] == "Bearer"
    # compose mounts the key as a config (Prometheus reads no environment variables)
    mounted = {c["target"]: c["source"] for c in services()["prometheus"].get("configs", [])}
    source = mounted[authorization["credentials_file"]]
    assert compose()["configs"][source]["content"].strip() in keys


def provisioned_datasources() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted((PROVISIONING / "datasources").glob("*.yaml")):
        for ds in yaml.safe_load(path.read_text())["datasources"]:
            found[ds["uid"]] = ds
    return found


def test_grafana_provisioning_is_mounted_and_complete() -> None:
    all_services = services()
    grafana = all_services["grafana"]
    assert host_path(grafana, "/etc/grafana/provisioning/datasources") == PROVISIONING / "datasources"
    assert host_path(grafana, "/etc/grafana/provisioning/dashboards") == PROVISIONING / "dashboards"
    datasources = provisioned_datasources()
    types = {ds["type"] for ds in datasources.values()}
    assert {"prometheus", "grafana-postgresql-datasource"} <= types
    prom = next(ds for ds in datasources.values() if ds["type"] == "prometheus")
    assert urlsplit(prom["url"]).hostname == "prometheus"
    ledger = next(ds for ds in datasources.values() if ds["type"] == "grafana-postgresql-datasource")
    assert ledger["url"].split(":")[0] == "postgres"
    assert ledger["jsonData"]["database"] == env(all_services["postgres"])["POSTGRES_DB"]
    # The read-only login: created by the postgres init script with the password Grafana gets.
    init_script = host_path(all_services["postgres"], "/docker-entrypoint-initdb.d")
    assert any(ledger["user"] in script.read_text() for script in init_script.glob("*.sh"))
    password_var = ledger["secureJsonData"]["password"].lstrip("$").strip("{}")
    assert env(grafana)[password_var] == env(all_services["postgres"])[password_var]
    providers = yaml.safe_load(next((PROVISIONING / "dashboards").glob("*.yaml")).read_text())["providers"]
    for provider in providers:
        assert host_path(grafana, provider["options"]["path"]) == DASHBOARDS
    assert host_path(grafana, env(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]).is_file()


def test_dashboards_are_valid_grafana_json() -> None:
    found = dashboards()
    assert {"gateway-ops.json", "finance.json"} <= set(found)
    datasources = provisioned_datasources()
    uids = [dash["uid"] for dash in found.values()]
    assert len(set(uids)) == len(uids)
    for name, dash in found.items():
        assert dash["schemaVersion"] >= 36 and dash["title"] and dash["panels"], name
        ids = [panel["id"] for panel in panels(dash)]
        assert len(set(ids)) == len(ids), f"{name}: panel ids repeat"
        for panel in panels(dash):
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, f"{name}: {panel['title']} is wider than the grid"
            if panel["type"] == "row":
                continue
            assert panel["targets"], f"{name}: {panel['title']} has no query"
            for target in panel["targets"]:
                ds = target.get("datasource") or panel["datasource"]
                assert ds["uid"] in datasources, f"{name}: {panel['title']}: datasource {ds['uid']} is not provisioned"
                assert datasources[ds["uid"]]["type"] == ds["type"]
                assert ("expr" in target) == (ds["type"] == "prometheus")
                assert ("rawSql" in target) == (ds["type"] == "grafana-postgresql-datasource")


def test_ops_dashboard_covers_what_operators_watch() -> None:
    exprs = " ".join(expr for where, expr in prometheus_exprs() if where.startswith("gateway-ops.json"))
    for needed in ("gateway_requests_total", "gateway_request_duration_seconds_bucket", "gateway_time_to_first_token_seconds_bucket",
                   "gateway_upstream_attempts_total", "gateway_tokens_total", "gateway_requests_in_flight",
                   "gateway_policy_reloads_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
                   "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
        assert needed in exprs, f"the ops dashboard does not show {needed}"
    assert "histogram_quantile(0.99" in exprs and "histogram_quantile(0.5" in exprs


def test_every_promql_metric_is_one_the_gateway_or_vllm_exports() -> None:
    known = known_series()
    for where, expr in prometheus_exprs():
        names = promql_metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = [n for n in names if n not in known]
        assert not unknown, f"{where}: {unknown} is neither registered by gateway.telemetry.metrics.Metrics nor a vLLM metric"


def test_promql_groups_only_by_bounded_labels() -> None:
    for where, expr in prometheus_exprs():
        assert not re.search(r"\bwithout\s*\(", expr), f"{where}: `without` keeps every other label"
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            labels = {label.strip() for label in group.split(",") if label.strip()}
            assert labels <= BOUNDED_LABELS, f"{where}: groups by {labels - BOUNDED_LABELS}"
        if re.search(r"\b(?:rate|increase)\(", expr) or "gateway_requests_in_flight" in expr or "vllm:" in expr:
            assert re.match(r"\s*(?:histogram_quantile\(\s*[\d.]+\s*,\s*)?(?:sum|max|min|avg)\b", expr), \
                f"{where}: aggregate the series (sum by ...) instead of plotting one per label set: {expr}"


def test_finance_sql_reads_the_ledger_and_shows_money_in_usd() -> None:
    queries = sql_targets()
    assert queries
    joined = " ".join(sql for _, sql in queries)
    for table in ("usage_events", "budgets", "reservations"):
        assert re.search(rf"\bFROM\s+{table}\b", joined), f"the finance dashboard does not read {table}"
    for where, sql in queries:
        for table in re.findall(r"\b(?:FROM|JOIN)\s+(\w+)", sql):
            assert table in LEDGER_TABLES, f"{where}: unknown table {table}"
        assert not re.search(r"\b(?:INSERT|UPDATE|DELETE|DROP|ALTER|CREATE)\b", sql, re.IGNORECASE), where
        macros = re.findall(r"\$__\w+\(\)?", sql)
        assert set(macros) <= GRAFANA_SQL_MACROS, f"{where}: unexpected macro {set(macros) - GRAFANA_SQL_MACROS}"
        # money columns are pico-dollars: shown divided by 1e12, or only as a ratio
        for match in re.finditer(r"\b(\w+_pico)\b(?!\s*\)?\s*/\s*1e12)", sql):
            context = sql[max(0, match.start() - 60):match.end() + 40]
            assert "/ 1e12" in context or "NULLIF" in context or "IS NOT NULL" in context, f"{where}: {match.group(1)} not in USD"
    finance = dashboards()["finance.json"]
    units = json.dumps(finance)
    assert "currencyUSD" in units


def finance_tenant_variable() -> dict[str, Any]:
    variables = {var["name"]: var for var in dashboards()["finance.json"]["templating"]["list"]}
    found: dict[str, Any] = variables["tenant"]
    return found


def test_every_finance_panel_follows_the_tenant_filter() -> None:
    tenant = finance_tenant_variable()
    assert tenant["datasource"]["type"] == "grafana-postgresql-datasource" and tenant["multi"] and tenant["includeAll"]
    assert re.search(r"\bFROM\s+usage_events\b", tenant["query"])
    for where, sql in sql_targets():
        assert "$tenant" in sql, f"{where} ignores the tenant filter"


def expand_grafana_sql(sql: str, start: datetime, end: datetime, tenants: list[str] | None = None) -> str:
    """What Grafana sends: time macros as literals, and `$tenant` as quoted values (the
    variable's custom all-value for All, None)."""
    lo, hi = f"'{start:%Y-%m-%dT%H:%M:%SZ}'", f"'{end:%Y-%m-%dT%H:%M:%SZ}'"
    sql = sql.replace("$__timeFrom()", lo).replace("$__timeTo()", hi)
    chosen = finance_tenant_variable()["allValue"] if tenants is None else ",".join(f"'{t}'" for t in tenants)
    sql = sql.replace("${tenant}", chosen).replace("$tenant", chosen)
    return re.sub(r"\$__timeFilter\(([^)]+)\)", lambda m: f"{m.group(1)} BETWEEN {lo} AND {hi}", sql)


@pytest.mark.services
def test_finance_queries_run_on_the_ledger_schema(postgres_url: str) -> None:
    import psycopg

    from gateway.accounting.database import make_engine, migrate

    engine = make_engine(postgres_url, writer=True)
    try:
        migrate(engine)
    finally:
        engine.dispose()
    now = datetime.now(UTC).replace(microsecond=0)
    day = now.date().isoformat()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        spends = [("acme", "sim-small", 1_230_000_000_000, 10**11), ("acme", "sim-large", 770_000_000_000, 0),
                  ("globex", "sim-small", 5 * 10**12, 0)]
        for i, (tenant, model, cost, saved) in enumerate(spends):
            conn.execute(
                "INSERT INTO usage_events (request_id, attempt, tenant, key_id, kind, endpoint, model, upstream_model, upstream,"
                " status, usage_known, prompt_tokens_est, prompt_tokens, cached_tokens, cache_write_tokens, completion_tokens,"
                " reasoning_tokens, cost_pico, saved_pico, created_at, day, timeline)"
                " VALUES (%s, 1, %s, 'k1', 'model', 'chat', %s, %s, 'hosted', 'ok', true, 100, 100, 40, 0, 10, 0, %s, %s, %s, %s, '{}')",
                (f"req-{i}", tenant, model, model, cost, saved, now, day),
            )
        conn.execute(
            "INSERT INTO budgets (id, scope, period_start, limit_pico, reserved_pico, spent_pico, calls_used, tokens_reserved, tokens_used)"
            " VALUES (%s, 'tenant:acme', %s, %s, 0, %s, 0, 0, 0)",
            (f"tenant:acme:month:{day[:8]}01", f"{day[:8]}01", 50 * 10**12, 2 * 10**12),
        )
        conn.execute(
            "INSERT INTO reservations (id, request_id, tenant, key_id, model, upstream_model, upstream, endpoint, budget_ids,"
            " amount_pico, tokens, prompt_tokens_est, state, created_at, expires_at)"
            " VALUES ('h1', 'req-9', 'acme', 'k1', 'sim-small', 'sim-small', 'hosted', 'chat', 'b', %s, 10, 5, 'reserved', %s, %s)",
            (5 * 10**11, now, now + timedelta(minutes=15)),
        )
        results: dict[str, list[tuple[Any, ...]]] = {}
        everyone: dict[str, list[tuple[Any, ...]]] = {}
        for where, sql in sql_targets():
            window = (now - timedelta(days=7), now + timedelta(days=1))
            results[where] = conn.execute(expand_grafana_sql(sql, *window, ["acme"])).fetchall()
            everyone[where] = conn.execute(expand_grafana_sql(sql, *window)).fetchall()
            assert results[where] and everyone[where], f"{where} returns no rows"

    def one(title: str) -> float:
        rows = results[f"finance.json: {title}"]
        return float(rows[0][0])

    assert float(everyone["finance.json: Spend"][0][0]) == pytest.approx(7.0), "All: every tenant"
    assert one("Spend") == pytest.approx(2.0), "acme only"
    assert one("Saved by cached tokens") == pytest.approx(0.1)
    assert one("Open reservations") == 1
    assert one("Held by open reservations") == pytest.approx(0.5)
    budget = results["finance.json: Budget use (current period)"]
    assert [(row[0], float(row[3]), float(row[5])) for row in budget] == [("tenant:acme", 2.0, pytest.approx(0.04))]
    per_tenant_day = results["finance.json: Spend per tenant per day"]
    assert [(row[1], float(row[2])) for row in per_tenant_day] == [("acme", pytest.approx(2.0))]
