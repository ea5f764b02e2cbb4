"""A stream is relayed as the upstream produces it: the gaps between its chunks
survive the gateway, so the client's first token is not held back for the rest."""

from __future__ import annotations

import time
from itertools import pairwise

import openai

from tests.e2e.conftest import sim_config
from tests.support.stack import Stack

DELAY_S = 0.05  # the simulator's pause between streamed chunks


def test_chunks_reach_the_client_as_the_upstream_sends_them(fresh_stack: Stack) -> None:
    sim_config(fresh_stack.hosted, token_delay_s=DELAY_S, output_tokens=9)
    client = openai.OpenAI(base_url=fresh_stack.gateway, api_key=fresh_stack.key, max_retries=0)
    arrivals: list[float] = []
    stream = client.chat.completions.create(model="gpt-4o-mini", stream=True,
                                            messages=[{"role": "user", "content": "count slowly"}])
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic())
    gaps = sorted(b - a for a, b in pairwise(arrivals))
    assert len(arrivals) >= 8
    # Buffered, the chunks would arrive together (gaps near 0); relayed, they keep the
    # upstream's pacing. The median is robust to a stalled client catching up once.
    assert gaps[len(gaps) // 2] >= DELAY_S / 2, gaps
