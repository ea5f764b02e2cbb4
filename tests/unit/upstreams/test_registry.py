"""The upstream registry across policy reloads: an unchanged upstream keeps its client
(and its warm connections), an edited one gets a new client and the old one is closed
once idle, a removed one is gone."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import orjson

from gateway.routing.loader import parse_policy
from gateway.routing.policy import Policy
from gateway.upstreams.registry import UpstreamRegistry
from tests.fakes.gateway import BASE_POLICY


def parsed(fields: dict[str, Any]) -> Policy:
    return parse_policy(orjson.dumps(fields).decode())


def test_a_reload_keeps_unchanged_upstreams_and_replaces_edited_ones() -> None:
    edited = copy.deepcopy(BASE_POLICY)
    edited["upstreams"]["backup"]["timeout_s"] = 30

    async def run() -> None:
        registry = UpstreamRegistry()
        registry.sync(parsed(BASE_POLICY))
        hosted, backup = registry.get("hosted"), registry.get("backup")
        assert (hosted.name, hosted.kind, registry.get("anthropic").kind) == ("hosted", "openai", "anthropic")
        registry.sync(parsed(edited))
        assert registry.get("hosted") is hosted, "unchanged: same client, same connections"
        assert registry.get("backup") is not backup and registry.get("backup").name == "backup"
        await registry.aclose()

    asyncio.run(run())


def test_an_upstream_the_policy_drops_is_no_longer_handed_out() -> None:
    fewer = copy.deepcopy(BASE_POLICY)
    del fewer["upstreams"]["backup"]
    fewer["models"] = {"small": {"upstream": "hosted", "price": {"input": 1, "output": 2}}}
    fewer["routes"] = {}

    async def run() -> None:
        registry = UpstreamRegistry()
        registry.sync(parsed(BASE_POLICY))
        registry.sync(parsed(fewer))
        try:
            registry.get("backup")
        except KeyError:
            pass
        else:
            raise AssertionError("a dropped upstream was still handed out")
        await registry.aclose()

    asyncio.run(run())


def test_headers_added_for_one_client_do_not_stick_to_the_upstream() -> None:
    async def run() -> None:
        registry = UpstreamRegistry()
        registry.sync(parsed(BASE_POLICY))
        anthropic = registry.get("anthropic")
        versioned = anthropic.with_headers({"anthropic-version": "2023-06-01"})
        both = versioned.with_headers({"anthropic-beta": "tools"})
        assert (versioned.name, both.name) == ("anthropic", "anthropic")
        assert getattr(both, "headers", None) == {"anthropic-version": "2023-06-01", "anthropic-beta": "tools"}
        assert getattr(versioned, "headers", None) == {"anthropic-version": "2023-06-01"}
        assert registry.get("anthropic") is anthropic
        await registry.aclose()

    asyncio.run(run())
