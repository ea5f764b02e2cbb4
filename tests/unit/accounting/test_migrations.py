"""Upgrading a ledger keeps its data: a database at an older schema version is
migrated in place, and migrating twice changes nothing."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect, text

from gateway.accounting.database import MIGRATIONS, make_engine, migrate


def test_v1_ledger_upgrades_in_place_and_keeps_its_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(url, writer=True)
    migrate(engine)
    # Make it look like a ledger written by schema v1: no v2 columns, one booked row.
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE usage_events DROP COLUMN checks")
        conn.exec_driver_sql("ALTER TABLE usage_events DROP COLUMN escalation")
        conn.exec_driver_sql("DELETE FROM schema_version WHERE version > 1")
        conn.execute(text(
            "INSERT INTO usage_events (request_id, attempt, tenant, key_id, kind, endpoint, model, upstream_model, upstream, status,"
            " usage_known, prompt_tokens_est, prompt_tokens, cached_tokens, cache_write_tokens, completion_tokens, reasoning_tokens,"
            " cost_pico, saved_pico, created_at, day, timeline) VALUES ('req_old', 1, 'acme', 'key_1', 'model', 'chat.completions',"
            " 'm', 'm', 'u', 'ok', 1, 10, 10, 0, 0, 5, 0, 123456, 0, '2026-01-01 00:00:00', '2026-01-01', '{}')"))
    assert migrate(engine) == max(v for v, _ in MIGRATIONS)
    assert migrate(engine) == max(v for v, _ in MIGRATIONS)  # idempotent
    columns = {c["name"] for c in inspect(engine).get_columns("usage_events")}
    assert {"checks", "escalation"} <= columns
    with engine.connect() as conn:
        assert conn.execute(text("SELECT cost_pico FROM usage_events WHERE request_id = 'req_old'")).scalar_one() == 123456
        versions = [r[0] for r in conn.execute(text("SELECT version FROM schema_version ORDER BY version"))]
    assert versions == [v for v, _ in MIGRATIONS]
    engine.dispose()
