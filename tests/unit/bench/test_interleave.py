"""The call-by-call schedule treats both gateways alike: a direct call before each of
their calls, and each follows its own previous call as often as the other's."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from bench.interleave import parse_args, schedule


def test_every_gateway_call_follows_a_direct_one_and_each_follows_itself_half_the_time() -> None:
    calls = list(schedule(200))
    assert Counter(calls) == {"direct": 400, "a": 200, "b": 200}
    assert all(calls[i - 1] == "direct" for i, name in enumerate(calls) if name != "direct")
    gateway_calls = [name for name in calls if name != "direct"]
    follows_itself = Counter(name for prev, name in itertools.pairwise(gateway_calls) if prev == name)
    assert follows_itself == {"a": 99, "b": 100}  # 199 changes of round, taken in turn


def test_it_needs_two_checkouts_of_this_project(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--tree", "."])
    with pytest.raises(SystemExit):
        parse_args(["--tree", ".", "--tree", str(tmp_path)])
    assert len(parse_args([]).tree) == 2
