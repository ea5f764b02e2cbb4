"""200 streaming requests at once: every one completes with its own, un-interleaved text."""

from __future__ import annotations

import asyncio

import openai

from tests.support.stack import Stack

N = 200


def test_200_concurrent_streams_complete_intact(stack: Stack) -> None:
    async def go() -> None:
        # The SDK's default retries cover a pooled connection closed by a loaded machine;
        # every answer is still checked to be complete and un-interleaved.
        c = openai.AsyncOpenAI(base_url=stack.gateway, api_key=stack.key, timeout=60)

        async def one(i: int) -> tuple[str, set[str], str]:
            messages = [{"role": "user", "content": f"request number {i}: tell me something"}]
            stream = await c.chat.completions.create(model="gpt-4o-mini", messages=messages, stream=True)  # type: ignore[arg-type]
            ids: set[str] = set()
            parts: list[str] = []
            async for chunk in stream:
                ids.add(chunk.id)
                if chunk.choices:
                    parts.append(chunk.choices[0].delta.content or "")
            whole = await c.chat.completions.create(model="gpt-4o-mini", messages=messages)  # type: ignore[arg-type]
            return "".join(parts), ids, whole.choices[0].message.content or ""

        results = await asyncio.gather(*(one(i) for i in range(N)))
        await c.close()
        assert len(results) == N
        for streamed, ids, whole in results:
            assert len(ids) == 1, "chunks of different responses were interleaved"
            assert streamed == whole
        assert len({streamed for streamed, _, _ in results}) > N // 2, "answers should differ by prompt"

    asyncio.run(go())
