"""A generic CSV export of provider usage (a billing console download, a spreadsheet a
provider emailed), read into `ProviderUsage` rows.

One header row, then one line per (day, model[, key]); lines for the same group are
summed. Column names are matched case-insensitively, with the aliases below:

    day          day | date | start_time   (YYYY-MM-DD, or an ISO timestamp taken in UTC)
    model        model | line_item
    key          api_key_id | key_id | key                          (optional)
    input        input_tokens | prompt_tokens                       (includes cached)
    cached       input_cached_tokens | cached_tokens                (optional)
    output       output_tokens | completion_tokens                  (optional, else 0)
    requests     num_model_requests | requests                      (optional)
    cost         cost_usd | cost | amount                           (optional, USD)

A column that is absent is "not reported" and is not compared.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path

from gateway.accounting.money import pico_from_usd
from gateway.accounting.reconcile import ImportFailed, ProviderUsage, merge_rows

COLUMNS: dict[str, tuple[str, ...]] = {
    "day": ("day", "date", "start_time"),
    "model": ("model", "line_item"),
    "key": ("api_key_id", "key_id", "key"),
    "input": ("input_tokens", "prompt_tokens"),
    "cached": ("input_cached_tokens", "cached_tokens"),
    "output": ("output_tokens", "completion_tokens"),
    "requests": ("num_model_requests", "requests"),
    "cost": ("cost_usd", "cost", "amount"),
}
REQUIRED = ("day", "model", "input")


def read_csv_file(path: str | Path, since: date, until: date) -> list[ProviderUsage]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # spreadsheets like to add a BOM
    except OSError as exc:
        raise ImportFailed(f"{path}: cannot read: {exc.strerror}") from exc
    return parse_csv(text, since, until, source=f"csv {path.name}")


def parse_csv(text: str, since: date, until: date, source: str = "csv") -> list[ProviderUsage]:
    """Rows for the UTC days [since, until); lines outside that range are skipped."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise ImportFailed(f"{source}: the file is empty")
    where = _locate(header, source)
    rows = []
    for line, cells in enumerate(reader, start=2):
        if not any(cell.strip() for cell in cells):
            continue
        row = _row(cells, where, f"{source}:{line}", source)
        if since <= row.day < until:
            rows.append(row)
    return merge_rows(rows)


def _locate(header: list[str], source: str) -> dict[str, int]:
    names = [name.strip().lower() for name in header]
    where = {}
    for field, aliases in COLUMNS.items():
        found = next((names.index(alias) for alias in aliases if alias in names), None)
        if found is not None:
            where[field] = found
    missing = [f"{field} ({' | '.join(COLUMNS[field])})" for field in REQUIRED if field not in where]
    if missing:
        raise ImportFailed(f"{source}: the header has no column for {', '.join(missing)}")
    return where


def _row(cells: list[str], where: Mapping[str, int], at: str, source: str) -> ProviderUsage:
    def cell(field: str) -> str | None:
        index = where.get(field)
        if index is None:
            return None
        return cells[index].strip() if index < len(cells) else ""

    model = cell("model")
    if not model:
        raise ImportFailed(f"{at}: no model")
    cost = cell("cost")
    return ProviderUsage(
        day=_day(cell("day") or "", at),
        model=model,
        key_id=cell("key") or None,
        input_tokens=_tokens(cell("input"), "input", at) or 0,
        cached_tokens=_tokens(cell("cached"), "cached", at),
        output_tokens=_tokens(cell("output"), "output", at) or 0,
        requests=_tokens(cell("requests"), "requests", at),
        cost_pico=None if cost is None else _pico(cost, at),
        source=source,
    )


def _day(value: str, at: str) -> date:
    try:
        if len(value) == 10:
            return date.fromisoformat(value)
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise ImportFailed(f"{at}: day {value!r} is not YYYY-MM-DD or an ISO timestamp") from None
    # A naive timestamp is taken as UTC, like the ledger's days.
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).astimezone(UTC).date()


def _tokens(value: str | None, what: str, at: str) -> int | None:
    if value is None:
        return None
    if value == "":
        return 0
    try:
        number = Decimal(value.replace(",", "").replace("_", ""))
    except InvalidOperation:
        number = Decimal(-1)
    if number < 0 or number != number.to_integral_value():
        raise ImportFailed(f"{at}: {what} {value!r} is not a whole non-negative number")
    return int(number)


def _pico(value: str, at: str) -> int:
    cleaned = value.removeprefix("$").replace(",", "").strip() or "0"
    try:
        return pico_from_usd(Decimal(cleaned).quantize(Decimal("1e-12")))
    except (InvalidOperation, ValueError):
        raise ImportFailed(f"{at}: cost {value!r} is not a USD amount") from None
