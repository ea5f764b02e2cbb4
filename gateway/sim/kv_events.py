"""vLLM's KV cache events, published as vLLM's `ZmqEventPublisher` does (PROTOCOLS.md):
a ZMQ PUB socket sending, per batch, the frames (topic, sequence number as 8 bytes
big-endian, msgpack of a `KVEventBatch`). The structs mirror vLLM's in
`vllm/distributed/kv_events.py`: msgspec structs encoded as maps, events tagged with
their class name under `type`, fields at their defaults left out. Block hashes are the
simulator's own (sha256 digests, as vLLM's sha256 hashing gives bytes).

Enabled by `--kv-events-config`, the JSON vLLM takes:
`{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "..."}`.
The replay socket vLLM can also open is not simulated."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

MEDIUM_GPU = "GPU"


class EventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class of the events; `tag=True`: each carries its class name as `type`."""


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DEFAULT_ENDPOINT = "tcp://*:5557"


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    endpoint: str = DEFAULT_ENDPOINT
    topic: str = ""


def parse_kv_events_config(text: str) -> KvEventsConfig | None:
    """vLLM's `--kv-events-config` JSON; None when it leaves events off."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("--kv-events-config: a JSON object")
    if not raw.get("enable_kv_cache_events") or raw.get("publisher", "zmq") == "null":
        return None
    if raw.get("publisher", "zmq") != "zmq":
        raise ValueError(f"--kv-events-config: publisher {raw['publisher']!r} is not simulated (zmq or null)")
    return KvEventsConfig(str(raw.get("endpoint", DEFAULT_ENDPOINT)), str(raw.get("topic", "")))


class ZmqPublisher:
    """One PUB socket. Bound when the endpoint is a wildcard (`tcp://*:N`), ipc or inproc,
    else connected - vLLM's rule ("bind stable, connect volatile"). Sends without
    blocking: a subscriber that is not keeping up loses batches, as with vLLM's PUB."""

    def __init__(self, config: KvEventsConfig) -> None:
        self.config = config
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._socket.set_hwm(100_000)
        self._socket.setsockopt(zmq.LINGER, 0)
        endpoint = config.endpoint
        if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            self._socket.bind(endpoint)
        else:
            self._socket.connect(endpoint)
        self._topic = config.topic.encode("utf-8")
        self._encoder = msgspec.msgpack.Encoder()
        self._seq = 0

    def publish(self, events: list[KVCacheEvent]) -> None:
        payload = self._encoder.encode(KVEventBatch(ts=time.time(), events=events, data_parallel_rank=0))  # type: ignore[arg-type]
        try:
            self._socket.send_multipart((self._topic, self._seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # over the high-water mark: dropped, the sequence number shows the gap
        self._seq += 1

    def close(self) -> None:
        self._socket.close(linger=0)
