"""The ledger database going away loses nothing: requests that would need a budget
hold are refused with a clear 503 before anything is sent upstream, answers already
given are spooled locally, and once the database is back the sweeper books them -
exactly once."""

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
from gateway.sim.hosted import create_hosted_app
from tests.conftest import POSTGRES_DSN
from tests.e2e.test_openai_sdk import wait_until
from tests.support.policies import single_model_policy
from tests.support.servers import run_asgi_in_thread

ADMIN = "outage-admin"


@pytest.mark.services
def test_database_outage_spools_settlements_and_replays_them_once(tmp_path: Path, postgres_url: str) -> None:
    capped, free = new_api_key(), new_api_key()
    name = postgres_url.rsplit("/", 1)[1]
    with run_asgi_in_thread(create_hosted_app()) as hosted:
        policy = tmp_path / "policy.yaml"
        policy.write_text(single_model_policy(hosted, {"capped": (capped, 'budget: {usd: "5.00"}'), "free": (free, "")}))
        settings = Settings(gateway_policy=policy, gateway_var_dir=tmp_path / "var", database_url=postgres_url,
                            gateway_admin_key=ADMIN, gateway_sweep_interval_s=3600)
        with run_asgi_in_thread(create_app(settings)) as gateway:
            def chat(key: str, text_: str) -> httpx.Response:
                return httpx.post(f"{gateway}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                                  json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text_}]})

            assert chat(free, "before").status_code == 200
            with psycopg.connect(f"{POSTGRES_DSN}/test", autocommit=True) as admin:
                admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')

            refused = chat(capped, "needs a hold")
            assert refused.status_code == 503 and "ledger" in refused.json()["error"]["message"]
            answered = chat(free, "during the outage")
            assert answered.status_code == 200, "an answer that needs no hold is still served"
            # Its settlement commits after the answer (it needs no fsync of its own), so
            # it lands in the spool a moment later.
            wait_until(lambda: bool(list((tmp_path / "var").glob("ledger-spool-*.jsonl"))))

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
    assert answered.headers["x-request-id"] in {r[0] for r in rows}
    assert all(count == 1 for _, count in rows)
    assert not list((tmp_path / "var").glob("ledger-spool-*"))
