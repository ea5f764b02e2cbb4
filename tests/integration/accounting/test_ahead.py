"""Holds made ahead of demand, on a temporary SQLite and PostgreSQL ledger: the next matching request
draws on one without a commit of its own, the books name the request that did, and
money held ahead goes back to the budget - call count included - when nobody draws on
it, when the gateway stops, and (through the spool) when the ledger was down. Near the
end of a budget nothing is held ahead. Last, the same through a running gateway."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, create_engine, text

from gateway.accounting.ahead import AheadKey, HoldsAhead
from gateway.accounting.database import make_engine, migrate
from gateway.accounting.ledger import BudgetClaim, Hold, Ledger
from gateway.accounting.money import pico_from_usd
from gateway.accounting.spool import SettlementSpool
from tests.e2e.test_openai_sdk import wait_until
from tests.integration.accounting.test_hold_sizing import ask, with_budget
from tests.support.stack import Stack, running_stack
from tests.unit.accounting.test_ledger import NOW, WIDE, with_ledger
from tests.unit.accounting.test_spool import event

ROOMY = BudgetClaim("tenant:acme:month:2026-11-01", "tenant:acme", "tenant `acme` budget", "2026-11-01", 10**12)
def SpoolFor(tmp_path: Path) -> SettlementSpool:
    return SettlementSpool(tmp_path / "var")


def key_on(claim: BudgetClaim, key_id: str = "key_1", model: str = "gpt-4o-mini") -> AheadKey:
    return AheadKey("acme", key_id, "chat", model, model, "hosted", claim.budget_id, claim.limit_pico)


KEY = key_on(ROOMY)
LATER = time.monotonic() + 30  # a request's deadline and grace, as `draw` takes them


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(url, writer=True)
    migrate(engine)
    yield engine
    engine.dispose()


def budget(engine: Engine, claim: BudgetClaim = ROOMY) -> tuple[int, int, int]:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT reserved_pico, spent_pico, calls_used FROM budgets WHERE id = :id"),
                           {"id": claim.budget_id}).one_or_none()
    return (0, 0, 0) if row is None else (row[0], row[1], row[2])


def reservations(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT request_id, state, settled_pico FROM reservations")).all())


async def ready(ahead: HoldsAhead, key: AheadKey = KEY, amount: int = 100, window_s: float = 10.0,
                claim: BudgetClaim = ROOMY) -> None:
    """Refill `key`'s pool, and wait until the holds are in."""
    ahead.prepare(key, claim, amount, 10, window_s, 60.0)
    await asyncio.gather(*(refill.made for refill in ahead._making.values()))


def test_the_next_matching_request_draws_on_the_hold_and_the_books_name_it(engine: Engine, tmp_path: Path) -> None:
    async def main(ledger: Ledger) -> Hold | None:
        ahead = HoldsAhead(ledger, SettlementSpool(tmp_path / "var"))
        await ready(ahead)
        batches = ledger.writer.batches
        hold = await ahead.draw(KEY, 80, 8, LATER, "req_9")
        assert ledger.writer.batches == batches, "drawing on a hold made ahead commits nothing"
        assert hold is not None
        assert await ledger.settle([hold], 30, 7, [event(9, hold.id)], NOW)
        return hold

    hold = with_ledger(engine, main)
    assert hold is not None and hold.amount_pico == 100 and hold.claimed_by == "req_9"
    assert reservations(engine) == [("req_9", "settled", 30)]
    assert budget(engine) == (0, 30, 1)


def test_a_request_the_hold_does_not_cover_holds_for_itself(engine: Engine, tmp_path: Path) -> None:
    other_model = key_on(ROOMY, model="gpt-4o")

    async def main(ledger: Ledger) -> list[Hold | None]:
        ahead = HoldsAhead(ledger, SettlementSpool(tmp_path / "var"))
        await ready(ahead)
        misses = [await ahead.draw(other_model, 10, 1, LATER, "req_1"),
                  await ahead.draw(KEY, 101, 1, LATER, "req_2"),  # costs more at worst
                  await ahead.draw(KEY, 10, 11, LATER, "req_3"),  # more tokens
                  await ahead.draw(KEY, 10, 1, time.monotonic() + 86_400, "req_4")]  # would outlive it
        assert ahead.held() == 1
        await ahead.drain()
        return misses

    assert with_ledger(engine, main) == [None, None, None, None]


def test_a_hold_nobody_draws_on_goes_back_with_its_call(engine: Engine, tmp_path: Path) -> None:
    async def main(ledger: Ledger) -> tuple[int, int, int]:
        ahead = HoldsAhead(ledger, SettlementSpool(tmp_path / "var"))
        await ready(ahead, window_s=0.05)
        held = budget(engine)
        deadline = time.monotonic() + 10
        while ahead.held() or ahead._releasing:
            assert time.monotonic() < deadline, "an unused hold made ahead must be released"
            await asyncio.sleep(0.01)
        return held

    assert with_ledger(engine, main) == (100, 0, 1)
    assert budget(engine) == (0, 0, 0)
    [(request_id, state, settled)] = reservations(engine)
    assert request_id.startswith("ahead_") and state == "released" and settled == 0


def test_stopping_releases_every_hold_made_ahead(engine: Engine, tmp_path: Path) -> None:
    keys = [key_on(ROOMY, key_id=f"key_{n}") for n in range(3)]

    async def main(ledger: Ledger) -> None:
        ahead = HoldsAhead(ledger, SettlementSpool(tmp_path / "var"))
        for key in keys:
            ahead.prepare(key, ROOMY, 100, 10, 10.0, 60.0)  # still being made when the drain starts
        await ahead.drain()
        assert ahead.held() == 0

    with_ledger(engine, main)
    assert budget(engine) == (0, 0, 0)
    assert sorted(state for _, state, _ in reservations(engine)) == ["released"] * 3


def test_nothing_is_held_ahead_near_the_end_of_a_budget(engine: Engine, tmp_path: Path) -> None:
    async def main(ledger: Ledger) -> int:
        ahead = HoldsAhead(ledger, SettlementSpool(tmp_path / "var"))
        await ready(ahead, key_on(WIDE), claim=WIDE)  # 100 of WIDE's 1,000 would leave room for fewer than 1,000 more
        return ahead.held()

    assert with_ledger(engine, main) == 0
    assert budget(engine, WIDE) == (0, 0, 0)
    assert reservations(engine) == []


def test_a_drawn_hold_whose_usage_is_unknown_names_its_request_until_it_expires(engine: Engine, tmp_path: Path) -> None:
    async def main(ledger: Ledger) -> int:
        ahead = HoldsAhead(ledger, SettlementSpool(tmp_path / "var"))
        await ready(ahead, KEY)
        drawn = await ahead.draw(KEY, 80, 8, LATER, "req_5")
        assert drawn is not None
        # The call was cut off: its event is booked, its hold stays for the sweeper.
        await ledger.settle([], 0, 0, [{**event(5, drawn.id), "status": "cancelled", "usage_known": False, "cost_pico": 0}], NOW)
        await ready(ahead, key_on(ROOMY, key_id="key_2"))
        # As if the gateway had died: a day after the holds' expiry, which the holds made
        # ahead took from the clock (not from NOW).
        return await ledger.expire_orphans(datetime.now(UTC) + timedelta(days=1))

    assert with_ledger(engine, main) == 2
    with engine.connect() as conn:
        unconfirmed = dict(conn.execute(text("SELECT request_id, error FROM usage_events WHERE status = 'unconfirmed'")).all())
    assert set(unconfirmed) == {"req_5", *(r for r in unconfirmed if r.startswith("ahead_"))} and len(unconfirmed) == 2
    drawn_reason = unconfirmed.pop("req_5")
    [never_drawn_reason] = unconfirmed.values()
    assert "held ahead" not in drawn_reason
    assert "held ahead of demand" in never_drawn_reason
    assert budget(engine) == (0, 200, 2), "an expired hold is charged its worst case, whoever made it"


def test_a_pool_drawn_faster_than_it_is_refilled_doubles_and_its_refill_shares_one_commit(engine: Engine,
                                                                                         tmp_path: Path) -> None:
    async def main(ledger: Ledger) -> list[tuple[int, int]]:
        ahead = HoldsAhead(ledger, SpoolFor(tmp_path), max_depth=8, steady_s=0)  # grown by bursts alone
        await ready(ahead)  # one hold: a key's pool starts at one
        seen = []
        for n in range(4):
            for i in range(ahead.held()):  # a burst of requests draws the pool empty...
                assert await ahead.draw(KEY, 80, 8, LATER, f"req_{n}_{i}") is not None
            ahead.prepare(KEY, ROOMY, 100, 10, 10.0, 60.0)  # ...the last one refills it...
            # ...and two more come before that refill is in: one waits for it, the
            # other finds nothing (it holds for itself).
            waited, missed = await asyncio.gather(ahead.draw(KEY, 80, 8, LATER, f"req_{n}_waits"),
                                                  ahead.draw(KEY, 80, 8, LATER, f"req_{n}_misses"))
            assert waited is not None and missed is None
            batches = ledger.writer.batches
            await ready(ahead)  # the request after it refills the pool, as large as it now is
            seen.append((ahead.held(), ledger.writer.batches - batches))
        await ahead.drain()
        return seen

    # (holds ready, commits the refill took): the pool doubles, 1 -> 2 -> 4 -> 8, and
    # each refill's holds share one commit, however many; at its bound (8 here) the
    # pool stops growing, and with more than half of it left nothing is made.
    assert with_ledger(engine, main) == [(2, 1), (4, 1), (8, 1), (7, 0)]
    # The 19 holds drawn stay held for their requests (which would settle them); the
    # 7 nobody drew went back, call count included.
    assert budget(engine) == (19 * 100, 0, 19)


@pytest.mark.parametrize(("apart_s", "expected"), [(0.01, ([2, 4, 4, 8, 8, 8], 4)), (2.0, ([1, 1, 1, 1, 1, 1], 16))])
def test_a_key_called_steadily_one_call_at_a_time_shares_each_commit_over_several_calls(
        engine: Engine, tmp_path: Path, apart_s: float, expected: tuple[list[int], int]) -> None:
    """One call at a time, each drawing a hold and refilling the pool as a request does:
    calls `apart_s` apart (on the pool's clock). Within a second of each other the pool
    grows to 8 and a refill of four holds shares one commit; seconds apart it stays at one
    hold, one commit per call."""
    clock = [0.0]

    async def main(ledger: Ledger) -> tuple[list[int], int]:
        ahead = HoldsAhead(ledger, SpoolFor(tmp_path), clock=lambda: clock[0])
        await ready(ahead)
        sizes = []
        for n in range(22):
            clock[0] += apart_s
            assert await ahead.draw(KEY, 80, 8, LATER, f"req_{n}") is not None, "nobody waits for a commit"
            await ready(ahead)
            if n < 6:
                sizes.append(ahead._depth.get(KEY, 1))
            if n == 5:
                batches = ledger.writer.batches
        commits = ledger.writer.batches - batches
        await ahead.drain()
        return sizes, commits

    assert with_ledger(engine, main) == expected


def test_a_pool_larger_than_its_demand_halves_as_its_holds_go_unused(engine: Engine, tmp_path: Path) -> None:
    async def main(ledger: Ledger) -> list[int]:
        ahead = HoldsAhead(ledger, SpoolFor(tmp_path), steady_s=0)
        await ready(ahead)
        for n in range(2):  # grown to 4 by two requests that found nothing ready
            while ahead.held():
                await ahead.draw(KEY, 80, 8, LATER, f"req_{n}_{ahead.held()}")
            ahead.prepare(KEY, ROOMY, 100, 10, 0.05, 60.0)
            await asyncio.gather(ahead.draw(KEY, 80, 8, LATER, f"req_{n}_waits"),
                                 ahead.draw(KEY, 80, 8, LATER, f"req_{n}_misses"))
        await ready(ahead, window_s=0.05)
        grown = ahead.held()
        deadline = time.monotonic() + 10
        while ahead.held() or ahead._releasing:  # nobody draws: every hold goes back
            assert time.monotonic() < deadline, "unused holds made ahead must be released"
            await asyncio.sleep(0.01)
        await ready(ahead)  # the next refill: as small as the demand turned out
        return [grown, ahead.held()]

    assert with_ledger(engine, main) == [4, 1]


def test_a_failure_to_hold_ahead_costs_the_next_request_nothing_but_the_shortcut(engine: Engine, tmp_path: Path,
                                                                                  caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Ledger):
        async def reserve(self, *args: Any, **kwargs: Any) -> Hold:
            raise RuntimeError("a bug on the way to the ledger")

        def reserve_soon(self, *args: Any, **kwargs: Any) -> asyncio.Future[Hold]:
            failed: asyncio.Future[Hold] = asyncio.get_running_loop().create_future()
            failed.set_exception(RuntimeError("a bug on the way to the ledger"))  # as the writer reports an op's bug
            return failed

    async def main(ledger: Ledger) -> Hold | None:
        ahead = HoldsAhead(ledger, SettlementSpool(tmp_path / "var"))
        ahead.prepare(KEY, ROOMY, 100, 10, 10.0, 60.0)
        return await ahead.draw(KEY, 80, 8, LATER, "req_1")  # waits for the attempt, then holds for itself

    assert with_ledger(engine, main, kind=Broken) is None
    assert "could not hold ahead" in caplog.text


def test_a_release_spooled_while_the_ledger_was_down_gives_the_call_back_too(engine: Engine, tmp_path: Path) -> None:
    spool = SettlementSpool(tmp_path / "var")

    async def main(ledger: Ledger) -> int:
        ahead = HoldsAhead(ledger, spool)
        await ready(ahead)
        [unused] = [ready.hold for pool in ahead._ready.values() for ready in pool]
        spool.write([unused], 0, 0, [], NOW, unused=True)  # what `_give_back` does when the ledger is down
        return await spool.replay(ledger)

    assert with_ledger(engine, main) == 1
    assert budget(engine) == (0, 0, 0)


def test_through_the_gateway_the_next_call_draws_on_the_hold_and_stopping_gives_the_rest_back(tmp_path: Path) -> None:
    with running_stack(tmp_path, edit_policy=with_budget) as stack:
        ledger = create_engine(f"sqlite:///{stack.var_dir / 'ledger.db'}")
        first = ask(stack)
        made_ahead = "SELECT count(*) FROM reservations WHERE state = 'reserved' AND substr(request_id, 1, 6) = 'ahead_'"
        wait_until(lambda: ledger_rows(ledger, made_ahead) == [(1,)])
        second = ask(stack)
        assert first.status_code == second.status_code == 200, (first.text, second.text)
        drawn = second.headers["x-request-id"]
        wait_until(lambda: ledger_rows(ledger, "SELECT state FROM reservations WHERE request_id = :r", r=drawn) == [("settled",)])
        [(reservation_id,)] = ledger_rows(ledger, "SELECT reservation_id FROM usage_events WHERE request_id = :r", r=drawn)
        assert reservation_id.startswith("rsv_ahead_"), "the second call drew on the hold made ahead of it"
    # Stopped: the holds made ahead of a third call went back, call count included.
    [(reserved, spent, calls)] = ledger_rows(ledger, "SELECT reserved_pico, spent_pico, calls_used FROM budgets")
    [(booked,)] = ledger_rows(ledger, "SELECT sum(cost_pico) FROM usage_events")
    states = sorted(state for (state,) in ledger_rows(ledger, "SELECT state FROM reservations"))
    ledger.dispose()
    assert (reserved, spent, calls) == (0, booked, 2)
    assert booked == pico_from_usd(Decimal(first.headers["x-gateway-cost-usd"]) + Decimal(second.headers["x-gateway-cost-usd"]))
    # Both calls settled; what was made ahead of a third went back: one hold, or two when
    # the second call came within a second of the first (the pool grows for steady calls).
    assert states[-2:] == ["settled", "settled"] and states[:-2] in (["released"], ["released", "released"]), states


def test_concurrent_calls_drawing_on_and_beside_holds_made_ahead_book_every_cent(tmp_path: Path) -> None:
    async def fire(stack: Stack, n: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            async def one(i: int) -> httpx.Response:
                body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"call {i}"}], "max_tokens": 20,
                        "stream": i % 3 == 0}
                return await client.post(f"{stack.gateway}/chat/completions", json=body,
                                         headers={"authorization": f"Bearer {stack.key}"})

            return list(await asyncio.gather(*(one(i) for i in range(n))))

    with running_stack(tmp_path, edit_policy=with_budget) as stack:
        ledger = create_engine(f"sqlite:///{stack.var_dir / 'ledger.db'}")
        answers = [*asyncio.run(fire(stack, 24)), *asyncio.run(fire(stack, 24))]
        assert [a.status_code for a in answers] == [200] * 48, [a.text for a in answers if a.status_code != 200]
    # Read once the gateway has stopped: an answered call's books commit after its answer.
    drawn = ledger_rows(ledger, "SELECT count(*) FROM usage_events WHERE reservation_id LIKE 'rsv_ahead%'")
    [(reserved, spent, calls)] = ledger_rows(ledger, "SELECT reserved_pico, spent_pico, calls_used FROM budgets")
    [(events, booked)] = ledger_rows(ledger, "SELECT count(*), sum(cost_pico) FROM usage_events")
    open_holds = ledger_rows(ledger, "SELECT count(*) FROM reservations WHERE state = 'reserved'")
    ledger.dispose()
    assert drawn[0][0] >= 1, "some calls drew on a hold made ahead"
    assert (events, calls) == (48, 48), "one event and one counted call per answered request, none for holds given back"
    assert (reserved, spent) == (0, booked) and open_holds == [(0,)]


def ledger_rows(engine: Engine, sql: str, **params: str) -> list[Any]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql), params)]
