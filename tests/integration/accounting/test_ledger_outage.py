"""The ledger database going away loses nothing: new calls are refused with a clear 503
and a retry-after before anything is sent upstream (no call goes out that is not on
record), calls already under way finish and their settlements are spooled locally, and
once the database is back the sweeper books them - exactly once. The outage costs the
log a line or two, not a traceback per request."""

from __future__ import annotations

from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import create_engine, text

from gateway.accounting.database import make_engine, migrate, normalise_url
from gateway.app import create_app
from gateway.auth.keys import new_api_key
from gateway.settings import Settings
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from tests.conftest import POSTGRES_DSN
from tests.e2e.test_openai_sdk import wait_until
from tests.support.policies import single_model_policy
from tests.support.servers import run_asgi_in_thread

ADMIN = "outage-admin"


@pytest.mark.services
def test_database_outage_spools_settlements_and_replays_them_once(tmp_path: Path, postgres_url: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    capped, free = new_api_key(), new_api_key()
    name = postgres_url.rsplit("/", 1)[1]
    with run_asgi_in_thread(create_hosted_app(HostedSimConfig(token_delay_s=0.1, output_tokens=10))) as hosted:
        policy = tmp_path / "policy.yaml"
        policy.write_text(single_model_policy(hosted, {"capped": (capped, 'budget: {usd: "5.00"}'), "free": (free, "")}))
        settings = Settings(gateway_policy=policy, gateway_var_dir=tmp_path / "var", database_url=postgres_url,
                            gateway_admin_key=ADMIN, gateway_sweep_interval_s=3600)
        with run_asgi_in_thread(create_app(settings)) as gateway:
            def chat(key: str, text_: str) -> httpx.Response:
                return httpx.post(f"{gateway}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                                  json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text_}]})

            assert chat(free, "before").status_code == 200
            with httpx.stream("POST", f"{gateway}/v1/chat/completions", headers={"authorization": f"Bearer {free}"}, timeout=30,
                              json={"model": "gpt-4o-mini", "stream": True,
                                    "messages": [{"role": "user", "content": "under way"}]}) as under_way:
                pieces = under_way.iter_raw()
                next(pieces)  # on record and streaming: now the database goes away
                with psycopg.connect(f"{POSTGRES_DSN}/test", autocommit=True) as admin:
                    admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
                caplog.clear()
                refused = [chat(key, "during the outage") for key in (capped, free) * 10]
                for _ in pieces:  # the call under way finishes; its settlement cannot commit
                    pass
            assert all(r.status_code == 503 for r in refused), [r.status_code for r in refused]
            assert all("ledger" in r.json()["error"]["message"] and r.headers["retry-after"] for r in refused)
            wait_until(lambda: bool(list((tmp_path / "var").glob("ledger-spool-*.jsonl"))))
            errors = [r for r in caplog.records if r.name.startswith("gateway") and r.levelname == "ERROR"]
            assert len(errors) <= 1, [r.getMessage() for r in errors]  # one line for the outage, not one per call

            with psycopg.connect(f"{POSTGRES_DSN}/test", autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
            engine = make_engine(postgres_url)
            migrate(engine)
            engine.dispose()
            for _ in range(2):  # a second sweep must not book anything twice
                swept = httpx.post(f"{gateway}/admin/sweep", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)
                assert swept.status_code == 200, swept.text

    engine = create_engine(normalise_url(postgres_url))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT request_id, count(*) FROM usage_events GROUP BY request_id")).all()
    engine.dispose()
    assert under_way.headers["x-request-id"] in {r[0] for r in rows}
    assert all(count == 1 for _, count in rows)
    assert not list((tmp_path / "var").glob("ledger-spool-*"))
