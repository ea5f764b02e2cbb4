"""Finance reads: spend grouped the way finance asks, straight from usage events."""

from __future__ import annotations

import csv
import io
from datetime import date
from typing import Any

from sqlalchemy import Engine, text

from gateway.accounting.money import usd

GROUPABLE = {"tenant": "tenant", "model": "model", "day": "day", "key": "key_id", "upstream": "upstream", "task": "task_id"}
MEASURES = ("cost_usd", "requests", "input_tokens", "cached_tokens", "output_tokens", "saved_usd")


def parse_group_by(raw: str | None) -> list[str]:
    names = [n.strip() for n in (raw or "tenant").split(",") if n.strip()]
    unknown = [n for n in names if n not in GROUPABLE]
    if unknown:
        raise ValueError(f"cannot group by {', '.join(unknown)}; choose from {', '.join(GROUPABLE)}")
    return list(dict.fromkeys(names))


def cost_rows(engine: Engine, group_by: list[str], since: date | None, until: date | None, tenant: str | None = None) -> list[dict[str, Any]]:
    """`until` is exclusive. Columns come from a fixed allow-list, never from input."""
    cols = [GROUPABLE[g] for g in group_by]
    where, params = ["1 = 1"], {}
    if since is not None:
        where.append("day >= :since")
        params["since"] = since.isoformat()
    if until is not None:
        where.append("day < :until")
        params["until"] = until.isoformat()
    if tenant is not None:
        where.append("tenant = :tenant")
        params["tenant"] = tenant
    select = ", ".join(f"{c} AS {g}" for c, g in zip(cols, group_by, strict=True))
    sql = (
        f"SELECT {select}, SUM(cost_pico) AS cost, COUNT(DISTINCT request_id) AS requests, SUM(prompt_tokens) AS input_tokens,"
        f" SUM(cached_tokens) AS cached_tokens, SUM(completion_tokens) AS output_tokens, SUM(saved_pico) AS saved"
        f" FROM usage_events WHERE {' AND '.join(where)} GROUP BY {', '.join(cols)} ORDER BY {', '.join(cols)}"
    )
    with engine.connect() as conn:
        rows = conn.execute(text(sql), params).mappings().all()
    return [
        {
            **{g: row[g] for g in group_by},
            "cost_usd": usd(int(row["cost"] or 0)),
            "requests": int(row["requests"] or 0),
            "input_tokens": int(row["input_tokens"] or 0),
            "cached_tokens": int(row["cached_tokens"] or 0),
            "output_tokens": int(row["output_tokens"] or 0),
            "saved_usd": usd(int(row["saved"] or 0)),
        }
        for row in rows
    ]


def rows_to_csv(rows: list[dict[str, Any]], group_by: list[str]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*group_by, *MEASURES], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
