"""The vLLM simulator's KV events over a real ZMQ socket, read as a vLLM subscriber reads
them: frames (topic, 8-byte big-endian sequence, msgpack KVEventBatch), events tagged
with their type; blocks stored once prefilled, removed when evicted, all cleared on a
reset."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import zmq

from gateway.sim.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, parse_kv_events_config
from gateway.sim.prompts import render_chat, token_ids
from tests.support.processes import VllmReplicaProcess, free_port

TOPIC = b"kv@sim@pool-model"


class Subscriber:
    def __init__(self, port: int) -> None:
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(f"tcp://127.0.0.1:{port}")
        self.socket.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.seqs: list[int] = []
        self.raw: list[Any] = []

    def next_batch(self, timeout_s: float = 5.0) -> KVEventBatch:
        assert self.socket.poll(int(timeout_s * 1000)), "no KV event batch arrived"
        topic, seq, payload = self.socket.recv_multipart()
        assert topic == TOPIC and len(seq) == 8
        self.seqs.append(int.from_bytes(seq, "big"))
        self.raw.append(msgspec.msgpack.decode(payload))
        batch: KVEventBatch = self.decoder.decode(payload)
        return batch

    def events(self, count: int) -> list[Any]:
        """The next `count` events, over as many batches as they come in."""
        found: list[Any] = []
        while len(found) < count:
            found += self.next_batch().events
        return found

    def quiet(self, timeout_s: float = 0.3) -> bool:
        return not self.socket.poll(int(timeout_s * 1000))


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[tuple[VllmReplicaProcess, int]]:
    port = free_port()
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": TOPIC.decode()}
    process = VllmReplicaProcess(["--num-gpu-blocks", "12", "--kv-events-config", json.dumps(config)], tmp_path / "sim.log")
    process.spawn_replica()
    try:
        process.wait_ready()
        yield process, port
    finally:
        process.stop()


def joined(replica: VllmReplicaProcess, port: int) -> Subscriber:
    """A PUB socket drops what it sends before a subscription reaches it: reset the cache
    until the subscriber hears an AllBlocksCleared, then it hears everything."""
    sub = Subscriber(port)
    deadline = time.monotonic() + 10
    while True:
        httpx.post(replica.root + "/reset_prefix_cache", timeout=5).raise_for_status()
        if sub.socket.poll(100):
            break
        assert time.monotonic() < deadline, "the subscription never took"
    while sub.socket.poll(100):
        sub.next_batch()
    sub.seqs.clear()
    return sub


def chat(replica: VllmReplicaProcess, words: int, salt: str) -> list[int]:
    """One request; the prompt's token ids as the simulator prefills them."""
    messages = [{"role": "user", "content": " ".join(f"word{i}" for i in range(words))}]
    body = {"model": "pool-model", "messages": messages, "max_tokens": 4, "cache_salt": salt}
    httpx.post(replica.url + "/chat/completions", json=body, timeout=10).raise_for_status()
    return token_ids(render_chat(messages))


def test_blocks_stored_removed_and_cleared_arrive_in_sequence_in_vllms_wire_format(replica: tuple[VllmReplicaProcess, int]) -> None:
    process, port = replica
    sub = joined(process, port)

    first = chat(process, 30, "tenant-a")
    [stored] = sub.events(1)
    full = len(first) // 16
    assert isinstance(stored, BlockStored) and full >= 3
    assert len(stored.block_hashes) == full and stored.parent_block_hash is None
    assert stored.token_ids == first[: full * 16] and stored.block_size == 16 and stored.medium == "GPU"
    assert all(isinstance(h, bytes) and len(h) == 32 for h in stored.block_hashes)

    chat(process, 30, "tenant-a")  # the same prompt: a hit, nothing new stored
    assert sub.quiet()

    chat(process, 30, "tenant-b")  # another tenant's salt: the same tokens are other blocks
    [other] = sub.events(1)
    assert isinstance(other, BlockStored) and not set(other.block_hashes) & set(stored.block_hashes)

    # A prompt that needs nearly all 12 blocks evicts the cached ones, least recently used first.
    big = chat(process, 80, "tenant-c")
    events = sub.events(2)
    while not isinstance(events[-1], BlockStored):
        events += sub.events(1)
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed and set(removed) <= set(stored.block_hashes) | set(other.block_hashes)
    assert isinstance(events[-1], BlockStored) and events[-1].token_ids == big[: len(big) // 16 * 16][: len(events[-1].token_ids)]

    httpx.post(process.root + "/reset_prefix_cache", timeout=5).raise_for_status()
    assert isinstance(sub.events(1)[0], AllBlocksCleared)

    assert sub.seqs == list(range(sub.seqs[0], sub.seqs[0] + len(sub.seqs))), "sequence numbers without gaps"
    # The layout itself, read without our structs: maps, the event's class under `type`.
    raw = sub.raw[-1]
    assert set(raw) == {"ts", "events", "data_parallel_rank"} and raw["events"] == [{"type": "AllBlocksCleared"}]
    assert sub.raw[1]["events"][0]["type"] == "BlockStored" and "extra_keys" not in sub.raw[1]["events"][0]


def test_the_kv_events_config_is_vllms() -> None:
    on = parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5999", "topic": "kv"}')
    assert on is not None and on.endpoint == "tcp://*:5999" and on.topic == "kv"
    assert parse_kv_events_config('{"enable_kv_cache_events": false}') is None
    assert parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "null"}') is None
    with pytest.raises(ValueError):
        parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "kafka"}')
