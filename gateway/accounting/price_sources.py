"""Where prices come from: the reviewed `pricing/*.yaml` files and litellm's price map.

This module reads and validates the sources into plain rows, all in USD per 1M tokens
as `Decimal`; `gateway.accounting.prices` decides which row applies to a request. YAML
numbers are read as `Decimal` and litellm's JSON with `parse_float=Decimal`, so no
binary float ever stands between a published price and the ledger.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError

from gateway.routing.policy import Name, Strict, Usd
from gateway.yaml_lines import Loc, SafeLoader, dotted, read_text, walk

TOKENS_PER_PRICE_UNIT = 1_000_000
SECONDS_PER_HOUR = 3600
# Derived rates (self-hosted, litellm's per-token floats) keep 9 decimals per 1M tokens,
# the precision a policy price may have: below a nano-dollar per million tokens.
RATE_PLACES = 9
LITELLM_SAMPLE_ENTRY = "sample_spec"

PositiveCount = Annotated[int, Field(ge=1)]


class PricingInvalid(Exception):
    """Pricing files that cannot be used; each problem names file, line and entry."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class GpuRate:
    """What a self-hosted row says about the hardware: the pool's cost split
    (accounting/pool_costs.py) reads it."""

    gpu_hour_usd: Decimal
    gpus: int  # per replica
    replicas: int | None  # None: as many as the policy lists
    input_tps: int  # expected tokens per second, per replica
    output_tps: int


@dataclass(frozen=True, slots=True)
class DatedPrice:
    """One reviewed row of a model's price history, USD per 1M tokens."""

    model: str
    effective_from: date
    input: Decimal
    output: Decimal
    cached_input: Decimal | None
    cache_write: Decimal | None
    note: str
    source: str  # e.g. "pricing/overrides.yaml"
    derivation: str | None = None  # how a GPU-hour rate became this per-token rate
    gpu: GpuRate | None = None  # self-hosted rows: the rate it was derived from
    cache_write_1h: Decimal | None = None  # Anthropic's 1-hour cache writes


@dataclass(frozen=True, slots=True)
class MapPrice:
    """One litellm price map entry converted to USD per 1M tokens."""

    key: str
    provider: str | None
    input: Decimal
    output: Decimal
    cached_input: Decimal | None
    cache_write: Decimal | None
    cache_write_1h: Decimal | None = None  # litellm: cache_creation_input_token_cost_above_1hr


# ---- pricing/*.yaml schema -------------------------------------------------------


class TokenPriceEntry(Strict):
    model: Name
    effective_from: date
    input: Usd
    output: Usd
    cached_input: Usd | None = None
    cache_write: Usd | None = None
    cache_write_1h: Usd | None = None
    note: str = Field(min_length=1, description="why this price, where it was published, who reviewed it")


class Throughput(Strict):
    input: PositiveCount
    output: PositiveCount


class GpuHourEntry(Strict):
    model: Name
    effective_from: date
    gpu_hour_usd: Usd
    gpus: PositiveCount = 1
    replicas: PositiveCount | None = Field(default=None, description="replicas the pool runs; default: as many as the policy lists")
    expected_tokens_per_second: Throughput
    cached_input: Usd | None = Field(default=None, description="USD per 1M tokens; a prefix-cache hit costs 0 unless given")
    note: str = Field(min_length=1)


class TokenPriceFile(Strict):
    kind: Literal["token_prices"]
    entries: list[TokenPriceEntry]


class GpuHourFile(Strict):
    kind: Literal["gpu_hours"]
    entries: list[GpuHourEntry]


FILE_KINDS: dict[str, type[TokenPriceFile] | type[GpuHourFile]] = {
    "token_prices": TokenPriceFile,
    "gpu_hours": GpuHourFile,
}


def read_pricing_dir(pricing_dir: Path) -> list[DatedPrice]:
    """Every row of every `*.yaml` file in `pricing_dir`; raises `PricingInvalid`."""
    if not pricing_dir.is_dir():
        raise PricingInvalid([f"{pricing_dir}: pricing directory does not exist"])
    rows: list[DatedPrice] = []
    problems: list[str] = []
    for path in sorted(pricing_dir.glob("*.yaml")):
        try:
            rows.extend(read_pricing_file(path, label=f"{pricing_dir.name}/{path.name}"))
        except PricingInvalid as exc:
            problems.extend(exc.problems)
    problems.extend(_duplicate_dates(rows))
    if problems:
        raise PricingInvalid(problems)
    return rows


def read_pricing_file(path: Path, label: str | None = None) -> list[DatedPrice]:
    label = label or path.name
    try:
        text = read_text(path)
    except OSError as exc:
        raise PricingInvalid([f"{path}: cannot read pricing file: {exc.strerror}"]) from exc
    except ValueError as exc:
        raise PricingInvalid([f"{path}: {exc}"]) from None
    data, lines = _load_yaml(text, str(path))
    schema = FILE_KINDS.get(str(data.get("kind"))) if isinstance(data, dict) else None
    if schema is None:
        kinds = " or ".join(FILE_KINDS)
        raise PricingInvalid([f"{path}:1: kind: must be {kinds} (a mapping with `kind:` and `entries:`)"])
    try:
        parsed = schema.model_validate(data)
    except ValidationError as exc:
        raise PricingInvalid([_entry_problem(str(path), data, lines, tuple(e["loc"]), _message(e)) for e in exc.errors()]) from exc
    if isinstance(parsed, GpuHourFile):
        return [_from_gpu_hours(entry, label) for entry in parsed.entries]
    return [
        DatedPrice(e.model, e.effective_from, e.input, e.output, e.cached_input, e.cache_write, e.note, label,
                   cache_write_1h=e.cache_write_1h)
        for e in parsed.entries
    ]


def _from_gpu_hours(entry: GpuHourEntry, label: str) -> DatedPrice:
    """Per-1M-token rate = GPU cost per second / expected tokens per second * 1M."""
    per_second = Fraction(entry.gpu_hour_usd) * entry.gpus / SECONDS_PER_HOUR
    tps = entry.expected_tokens_per_second
    derivation = (
        f"{entry.gpu_hour_usd} USD/GPU-hour x {entry.gpus} GPU at {tps.input} input / "
        f"{tps.output} output tokens per second"
    )
    return DatedPrice(
        model=entry.model,
        effective_from=entry.effective_from,
        input=_rate(per_second * TOKENS_PER_PRICE_UNIT / tps.input),
        output=_rate(per_second * TOKENS_PER_PRICE_UNIT / tps.output),
        cached_input=entry.cached_input if entry.cached_input is not None else Decimal(0),
        cache_write=None,
        note=entry.note,
        source=label,
        derivation=derivation,
        gpu=GpuRate(entry.gpu_hour_usd, entry.gpus, entry.replicas, tps.input, tps.output),
    )


def _rate(exact: Fraction) -> Decimal:
    # One half-even rounding, from the exact fraction: never via an intermediate float.
    rate = Decimal(round(exact * 10**RATE_PLACES)).scaleb(-RATE_PLACES).normalize()
    return rate.quantize(Decimal(1)) if rate == rate.to_integral_value() else rate  # 10, not 1E+1


def _duplicate_dates(rows: list[DatedPrice]) -> Iterator[str]:
    seen: dict[tuple[str, date], DatedPrice] = {}
    for row in rows:
        first = seen.setdefault((row.model, row.effective_from), row)
        if first is not row:
            yield (
                f"{row.source}: model {row.model} has two prices effective {row.effective_from} "
                f"(also in {first.source}); give each change its own date"
            )


# ---- YAML with line numbers and exact numbers ---------------------------------------


class _DecimalLoader(SafeLoader):  # type: ignore[misc,valid-type]
    """SafeLoader that reads YAML floats as `Decimal` (0.075 stays 0.075)."""


def _construct_decimal(loader: yaml.SafeLoader, node: yaml.Node) -> Decimal | str:
    text = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    try:
        return Decimal(text.replace("_", ""))
    except InvalidOperation:
        return text  # .inf / .nan: left as text so validation rejects it by name


_DecimalLoader.add_constructor("tag:yaml.org,2002:float", _construct_decimal)


def _load_yaml(text: str, source: str) -> tuple[Any, dict[Loc, int]]:
    loader = _DecimalLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise PricingInvalid([f"{source}:1: the pricing file is empty"])
        lines: dict[Loc, int] = {}
        duplicates = [f"{source}:{line}: {dotted(loc)}: {msg}" for loc, line, msg in walk(root, (), lines)]
        if duplicates:
            raise PricingInvalid(duplicates)
        return loader.construct_document(root), lines
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise PricingInvalid([f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}"]) from exc
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]




def _entry_problem(source: str, data: Any, lines: dict[Loc, int], loc: Loc, message: str) -> str:
    loc = tuple(p for p in loc if isinstance(p, int) or "[" not in p)  # drop pydantic's union tags
    probe = loc
    while probe and probe not in lines:
        probe = probe[:-1]
    where = f"{source}:{lines[probe]}" if probe in lines else source
    if len(loc) >= 2 and loc[0] == "entries" and isinstance(loc[1], int):
        entry = data["entries"][loc[1]]
        model = entry.get("model") if isinstance(entry, dict) else None
        named = f"entries[{loc[1]}] (model {model})" if model else f"entries[{loc[1]}]"
        rest = dotted(loc[2:])
        return f"{where}: {named}: {rest}: {message}" if rest else f"{where}: {named}: {message}"
    return f"{where}: {dotted(loc)}: {message}" if loc else f"{where}: {message}"


def _message(error: Any) -> str:
    friendly = {"extra_forbidden": "unknown key", "missing": "required key is missing"}
    return friendly.get(error["type"]) or str(error["msg"]).removeprefix("Value error, ")



# ---- litellm's price map, read as data ----------------------------------------------


def installed_litellm_price_map() -> tuple[Path, str] | None:
    """(path of the installed litellm's bundled price map, litellm's version), found
    without importing litellm (importing it costs seconds and patches the process)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model_prices_and_context_window_backup.json"
    if not path.is_file():
        return None
    return path, importlib.metadata.version("litellm")


# The only members of a price map entry the catalog reads.
_PRICE_FIELDS = frozenset({"litellm_provider", "input_cost_per_token", "output_cost_per_token",
                           "cache_read_input_token_cost", "cache_creation_input_token_cost",
                           "cache_creation_input_token_cost_above_1hr"})


class LitellmMap:
    """litellm's price map; an entry becomes a `MapPrice` when first looked up.

    Given a file, the map reads it on the first lookup, not before: a policy that prices
    each of its models itself (every example in policies/ does) never needs it, and
    reading it is ~0.1 s of a gateway's start-up and a few MB for good. Converting every
    one of its thousands of entries would be wasted work too (exact fractions, ~0.1 s):
    a gateway prices the handful of models in its policy. Conversions are cached per
    instance, bounded, so a name looked up twice gives the same object.
    """

    def __init__(self, source: dict[str, Any] | Path, cache_size: int = 1024) -> None:
        self._entries = _Entries(source)
        # lru_cache is thread-safe (reports price from worker threads too); over a
        # partial, not a bound method, so no reference cycle keeps a dropped map alive.
        self._converted = functools.lru_cache(maxsize=cache_size)(functools.partial(_entry_price, self._entries))

    def get(self, key: str) -> MapPrice | None:
        """The token-priced entry named `key`, or None. Entries without an input token
        price (per-image, per-second, ...) have none: the policy or an override must give one.
        Raises `PricingInvalid` if the map's file, read on this first lookup, is unreadable."""
        return self._converted(key)

    def read_now(self) -> None:
        """Read the file now if not yet read; raises `PricingInvalid` if unreadable."""
        self._entries.ensure()


class _Entries:
    """A map's entries: given, or read from its file once, on first use (under a lock:
    lookups come from worker threads too)."""

    def __init__(self, source: dict[str, Any] | Path) -> None:
        self.loaded: dict[str, Any] | None = source if isinstance(source, dict) else None
        self._path = source if isinstance(source, Path) else None
        self._lock = threading.Lock()

    def get(self, key: str) -> Any:
        return (self.loaded if self.loaded is not None else self.ensure()).get(key)

    def ensure(self) -> dict[str, Any]:
        with self._lock:
            if self.loaded is None:
                assert self._path is not None
                self.loaded = _read_litellm_file(self._path)
            return self.loaded


def _entry_price(entries: _Entries, key: str) -> MapPrice | None:
    entry = entries.get(key)
    if key == LITELLM_SAMPLE_ENTRY or not isinstance(entry, dict):
        return None
    return _map_price(key, entry)


def _read_litellm_file(path: Path) -> dict[str, Any]:
    """A litellm price map's entries; raises `PricingInvalid` if unreadable."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"), parse_float=Decimal, object_pairs_hook=_price_members)
    except (OSError, ValueError) as exc:
        raise PricingInvalid([f"{path}: cannot read litellm's price map: {exc}"]) from exc
    if not isinstance(raw, dict):
        raise PricingInvalid([f"{path}: litellm's price map is not a JSON object"])
    return raw


def _price_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Each JSON object as it is decoded, less the members no price is read from: entries
    are objects within an object, so objects are kept and, of other values, only the
    price fields. Decoding the whole map first leaves the process ~6 MB larger for good."""
    kept: dict[str, Any] = {}
    for key, value in pairs:
        if key in _PRICE_FIELDS or isinstance(value, dict):
            kept[key] = value
        else:
            kept.pop(key, None)  # a repeated key: the last value wins, as in a plain decode
    return kept


def _map_price(key: str, entry: dict[str, Any]) -> MapPrice | None:
    input_rate = _per_million(entry.get("input_cost_per_token"))
    if input_rate is None:
        return None
    provider = entry.get("litellm_provider")
    return MapPrice(
        key=key,
        provider=provider if isinstance(provider, str) else None,
        input=input_rate,
        # Embedding entries often omit output: they produce no output tokens to bill.
        output=_per_million(entry.get("output_cost_per_token")) or Decimal(0),
        cached_input=_per_million(entry.get("cache_read_input_token_cost")),
        cache_write=_per_million(entry.get("cache_creation_input_token_cost")),
        cache_write_1h=_per_million(entry.get("cache_creation_input_token_cost_above_1hr")),
    )


def _per_million(per_token: Any) -> Decimal | None:
    # bool is an int subclass; a `true` where a number belongs is not a price.
    if isinstance(per_token, bool) or not isinstance(per_token, int | Decimal):
        return None
    value = Decimal(per_token)
    if not value.is_finite() or value < 0:
        return None
    # The map is written by float-based tooling (5.0000000000000004E-8): rounding to
    # RATE_PLACES per 1M tokens removes those artifacts and nothing a provider charges.
    return _rate(Fraction(value) * TOKENS_PER_PRICE_UNIT)
