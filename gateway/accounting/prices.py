"""The price catalog: which price applies to a request, and what the request cost.

Precedence, per model: the policy's own `price:` > the latest `pricing/*.yaml` row in
effect at the request's time > litellm's bundled price map > no price (a policy error
for a routable model). Rows and the map are looked up by the policy's model name first,
then by its `upstream_model`. Money leaves this module as integer pico-dollars
(1e-12 USD), computed from exact fractions; nothing here touches a float.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from math import ceil
from pathlib import Path

from gateway.accounting.money import PICO_PER_USD, usd
from gateway.accounting.price_sources import (
    TOKENS_PER_PRICE_UNIT,
    DatedPrice,
    LitellmMap,
    MapPrice,
    PricingInvalid,
    installed_litellm_price_map,
    read_pricing_dir,
)
from gateway.routing.loader import PolicyCheck, PolicyInvalid, PolicyProblem, load_policy_file
from gateway.routing.policy import Policy, Price
from gateway.types.usage import Usage
from gateway.yaml_lines import Loc

__all__ = [
    "PICO_PER_USD",
    "PriceCatalog",
    "PriceQuote",
    "PricingInvalid",
    "every_model_priced",
    "missing_prices",
    "show_price",
    "usd",
]

PICO_PER_TOKEN_AT_ONE_USD = PICO_PER_USD // TOKENS_PER_PRICE_UNIT  # 1 USD per 1M tokens = 1e6 pico per token


@dataclass(frozen=True, slots=True)
class PriceQuote:
    """The price in effect for one model at one moment, USD per 1M tokens."""

    input: Decimal
    cached_input: Decimal
    cache_write: Decimal
    output: Decimal
    source: str
    effective_from: date | None
    cache_write_1h: Decimal | None = None  # Anthropic's 1-hour cache writes; None: at `cache_write`
    # The five rates in whole pico-dollars per token, when each is one (at most six
    # decimals, as every published price): then a cost is integer arithmetic alone.
    per_token: tuple[int, int, int, int, int] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.cache_write_1h is None:
            object.__setattr__(self, "cache_write_1h", self.cache_write)
        rates = [_whole_pico_per_token(r) for r in (self.input, self.cached_input, self.cache_write, self.output, self.write_1h)]
        whole = None if None in rates else (rates[0], rates[1], rates[2], rates[3], rates[4])
        object.__setattr__(self, "per_token", whole)

    @property
    def write_1h(self) -> Decimal:
        return self.cache_write if self.cache_write_1h is None else self.cache_write_1h

    def cost_pico(self, usage: Usage) -> int:
        """Exact cost; OpenAI semantics (prompt_tokens includes cached and cache-write
        tokens; completion_tokens includes reasoning tokens)."""
        # A provider reporting more cached than prompt tokens is still billed for every
        # token it reported, never credited a negative remainder.
        uncached = max(usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens, 0)
        hour = min(usage.cache_write_1h_tokens, usage.cache_write_tokens)  # 1-hour writes, at their own rate
        minutes = usage.cache_write_tokens - hour
        if self.per_token is not None:
            i, c, w, o, h = self.per_token
            return uncached * i + usage.cached_tokens * c + minutes * w + hour * h + usage.completion_tokens * o
        exact = _pico(
            (uncached, self.input),
            (usage.cached_tokens, self.cached_input),
            (minutes, self.cache_write),
            (hour, self.write_1h),
            (usage.completion_tokens, self.output),
        )
        return round(exact)  # Fraction rounds half to even; exact already when prices have <= 6 decimals

    def worst_case_pico(self, prompt_tokens: int, output_tokens: int) -> int:
        """Upper bound for a reservation: no usage within these bounds costs more."""
        # Cache writes may cost more than plain input (Anthropic: 1.25x), so the prompt
        # is bounded by the dearest input-side rate, not by `input` alone.
        if self.per_token is not None:
            i, c, w, o, h = self.per_token
            return prompt_tokens * max(i, c, w, h) + output_tokens * o
        dearest_input = max(self.input, self.cached_input, self.cache_write, self.write_1h)
        return ceil(_pico((prompt_tokens, dearest_input), (output_tokens, self.output)))

    def saved_pico(self, usage: Usage) -> int:
        """What the cached tokens saved against paying full input price for them."""
        if self.per_token is not None:
            return usage.cached_tokens * (self.per_token[0] - self.per_token[1])
        return round(_pico((usage.cached_tokens, self.input - self.cached_input)))

    def rates(self) -> str:
        hour = f" (1-hour {_num(self.write_1h)})" if self.write_1h != self.cache_write else ""
        return (
            f"input {_num(self.input)}, cached input {_num(self.cached_input)}, "
            f"cache write {_num(self.cache_write)}{hour}, output {_num(self.output)} (USD per 1M tokens)"
        )


def _pico(*terms: tuple[int, Decimal]) -> Fraction | int:
    # Fast path, exact: a rate with at most six decimals is a whole number of
    # pico-dollars per token, so integer arithmetic suffices.
    total = 0
    for tokens, rate in terms:
        per_token = _whole_pico_per_token(rate)
        if per_token is None:
            return sum((Fraction(t) * Fraction(r) * PICO_PER_TOKEN_AT_ONE_USD for t, r in terms), Fraction(0))
        total += tokens * per_token
    return total


@lru_cache(maxsize=4096)
def _whole_pico_per_token(rate: Decimal) -> int | None:
    scaled = rate * PICO_PER_TOKEN_AT_ONE_USD
    return int(scaled) if scaled == scaled.to_integral_value() else None


class PriceCatalog:
    """Immutable once loaded; build a new one to pick up edited pricing files."""

    def __init__(self, history: Iterable[DatedPrice], litellm: LitellmMap, litellm_label: str) -> None:
        by_model: dict[str, list[DatedPrice]] = {}
        for row in history:
            by_model.setdefault(row.model, []).append(row)
        self._history = {model: tuple(sorted(rows, key=lambda r: r.effective_from)) for model, rows in by_model.items()}
        self._litellm = litellm
        self.litellm_label = litellm_label

    @classmethod
    def load(cls, pricing_dir: Path, litellm_json: Path | None = None) -> PriceCatalog:
        """Read `pricing_dir/*.yaml`; litellm's map (the installed one unless a file is
        given) is read when a price is first looked up in it. Raises `PricingInvalid`
        naming file, line and entry."""
        installed = installed_litellm_price_map()
        if litellm_json is None and installed is not None:
            litellm_json = installed[0]
        if litellm_json is None:
            return cls(read_pricing_dir(pricing_dir), LitellmMap({}), "litellm price map (litellm is not installed)")
        if installed is not None and litellm_json.resolve() == installed[0].resolve():
            label = f"litellm {installed[1]} price map"
        else:
            label = f"litellm price map {litellm_json}"  # a file given explicitly, e.g. in tests
        return cls(read_pricing_dir(pricing_dir), LitellmMap(litellm_json), label)

    def history(self, name: str) -> tuple[DatedPrice, ...]:
        """The reviewed rows for one model name, oldest first."""
        return self._history.get(name, ())

    def read_map(self) -> None:
        """Read litellm's map now, if not yet read. For work that may look up any model
        (reconciliation, `pricing show`): an unreadable map then fails it up front,
        with `PricingInvalid`, not half-way through."""
        self._litellm.read_now()

    def with_pricing_dir(self, pricing_dir: Path) -> PriceCatalog:
        """A catalog with re-read pricing files and this one's litellm map (no re-parse)."""
        return PriceCatalog(read_pricing_dir(pricing_dir), self._litellm, self.litellm_label)

    def quote(self, model: str, upstream_model: str | None, policy_price: Price | None, at: datetime) -> PriceQuote | None:
        resolved = self._resolve(model, upstream_model, policy_price, _utc_day(at))
        return resolved[0] if resolved is not None else None

    def _resolve(
        self, model: str, upstream_model: str | None, policy_price: Price | None, day: date
    ) -> tuple[PriceQuote, DatedPrice | MapPrice | None] | None:
        """The quote and the row it came from (None for the policy's own price)."""
        if policy_price is not None:
            return _quote(policy_price, "policy", None, self._hour_rate(model, upstream_model, policy_price)), None
        names = _names(model, upstream_model)
        for name in names:
            row = _in_effect(self._history.get(name, ()), day)
            if row is not None:
                source = f"{row.source} (effective {row.effective_from.isoformat()})"
                return _quote(row, source, row.effective_from), row
        for name in names:
            entry = self._map_entry(name)
            if entry is not None:
                return _quote(entry, self.litellm_label, None), entry
        return None

    def describe(self, model: str, upstream_model: str | None, policy_price: Price | None, at: datetime) -> str:
        """Human text for `gateway pricing show MODEL`: the price in effect, its source,
        and every other price known for the model's names."""
        day = _utc_day(at)
        resolved = self._resolve(model, upstream_model, policy_price, day)
        used = resolved[1] if resolved is not None else None
        title = f"{model} (upstream model {upstream_model})" if upstream_model and upstream_model != model else model
        lines = [f"{title} at {at.isoformat()}"]
        if resolved is None:
            lines.append(f"  no price: not in the policy, in pricing/*.yaml or in the {self.litellm_label}")
        else:
            lines += [f"  effective price: {resolved[0].rates()}", f"  source: {resolved[0].source}"]
        for name in _names(model, upstream_model):
            lines += self._history_lines(name, day, used)
            entry = self._map_entry(name)
            if entry is not None:
                rates = _quote(entry, "", None).rates()
                marker = "  <- in effect" if entry is used else ""
                provider = f" ({entry.provider})" if entry.provider else ""
                lines.append(f"  {self.litellm_label}, entry `{entry.key}`{provider}: {rates}{marker}")
        return "\n".join(lines)

    def _history_lines(self, name: str, day: date, used: DatedPrice | MapPrice | None) -> list[str]:
        rows = self._history.get(name, ())
        if not rows:
            return []
        current = _in_effect(rows, day)
        lines = [f"  price history for {name}:"]
        for row in rows:
            marker = "  <- in effect" if row is used else ("  (in effect then; the source above wins)" if row is current else "")
            rates = _quote(row, "", None).rates()
            lines.append(f"    from {row.effective_from.isoformat()}: {rates} [{row.source}]{marker}")
            if row.derivation:
                lines.append(f"      derived from {row.derivation}")
            lines.append(f"      note: {row.note}")
        return lines

    def _hour_rate(self, model: str, upstream_model: str | None, price: Price) -> Decimal | None:
        """A policy price's rate for 1-hour cache writes: its own, else litellm's for the
        model - looked up only for a price that bills cache writes at all (Anthropic's
        models), so a policy of OpenAI-style prices never reads the map."""
        if price.cache_write_1h is not None or price.cache_write is None:
            return price.cache_write_1h
        for name in _names(model, upstream_model):
            entry = self._map_entry(name)
            if entry is not None and entry.cache_write_1h is not None:
                return entry.cache_write_1h
        return None

    def _map_entry(self, name: str) -> MapPrice | None:
        # litellm keys are sometimes provider-prefixed (`azure/...`); a prefixed name we
        # don't know exactly falls back to the bare model name.
        entry = self._litellm.get(name)
        if entry is None and "/" in name:
            entry = self._litellm.get(name.split("/", 1)[1])
        return entry


def _quote(price: Price | DatedPrice | MapPrice, source: str, since: date | None, hour_rate: Decimal | None = None) -> PriceQuote:
    # Unknown cache rates bill at the plain input price: never cheaper than published.
    return PriceQuote(
        cache_write_1h=price.cache_write_1h if price.cache_write_1h is not None else hour_rate,
        input=price.input,
        cached_input=price.input if price.cached_input is None else price.cached_input,
        cache_write=price.input if price.cache_write is None else price.cache_write,
        output=price.output,
        source=source,
        effective_from=since,
    )


def _names(model: str, upstream_model: str | None) -> tuple[str, ...]:
    if upstream_model is None or upstream_model == model:
        return (model,)
    return (model, upstream_model)


def _utc_day(at: datetime) -> date:
    # `effective_from` dates start at 00:00 UTC; a naive timestamp is taken as UTC.
    return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).astimezone(UTC).date()


def _in_effect(rows: Sequence[DatedPrice], day: date) -> DatedPrice | None:
    current = None
    for row in rows:  # sorted by date: the last one already in effect wins
        if row.effective_from <= day:
            current = row
    return current


def _num(value: Decimal) -> str:
    return format(value.normalize(), "f")


def missing_prices(policy: Policy, catalog: PriceCatalog, at: datetime) -> list[str]:
    """Models in the policy with no price from any source: each is a policy error,
    since every model can be routed to and would be served unbilled."""
    return [name for name, m in policy.models.items() if catalog.quote(name, m.upstream_model, m.price, at) is None]


def every_model_priced(catalog: PriceCatalog) -> PolicyCheck:
    """The policy check (routing/loader.py) that every model has a price in `catalog`."""
    def check(policy: Policy, source: str) -> list[tuple[Loc, str]]:
        try:
            unpriced = missing_prices(policy, catalog, datetime.now(UTC))
        except PricingInvalid as exc:  # litellm's map, read now that a model needs it, is unreadable
            raise PolicyInvalid([PolicyProblem(source, None, "models", problem) for problem in exc.problems]) from exc
        return [(("models", name), f"model `{name}` has no price: add `price:` here, or an entry in pricing/*.yaml "
                 "(litellm's price map does not know it either)") for name in unpriced]
    return check


def show_price(model: str, policy_path: str | None, pricing_dir: Path, at: datetime | None = None) -> tuple[int, str]:
    """`gateway pricing show MODEL [--policy FILE]`: (exit code, text to print)."""
    at = at or datetime.now(UTC)
    try:
        catalog = PriceCatalog.load(pricing_dir)
        catalog.read_map()
    except PricingInvalid as exc:
        return 1, "\n".join(exc.problems)
    upstream_model, policy_price, notes = None, None, []
    if policy_path is not None:
        try:
            policy = load_policy_file(policy_path)
        except PolicyInvalid as exc:
            return 1, "\n".join(str(p) for p in exc.problems)
        if model in policy.routes:
            chain = ", ".join(policy.routes[model].chain)
            return 1, f"{model} is a route in {policy_path}, not a model; price its models instead: {chain}"
        if model in policy.models:
            upstream_model, policy_price = policy.models[model].upstream_model, policy.models[model].price
        else:
            notes.append(f"  ({model} is not a model in {policy_path}; showing pricing files and litellm only)")
    text = "\n".join([catalog.describe(model, upstream_model, policy_price, at), *notes])
    return (0 if catalog.quote(model, upstream_model, policy_price, at) is not None else 1), text
