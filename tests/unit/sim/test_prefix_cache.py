"""vLLM-style prefix cache: chained block hashes, salt isolation, pinning, LRU eviction."""

from __future__ import annotations

from gateway.sim.prefix_cache import PrefixCache, block_hashes

BS = 16


def prompt(start: int, length: int) -> list[int]:
    return list(range(start, start + length))


def run(cache: PrefixCache, rid: str, tokens: list[int], salt: str | None = None, out: int = 4) -> int | None:
    """Allocate, prefill (commit) and finish one request; returns its cached tokens."""
    hashes = block_hashes(tokens, BS, salt)
    cached = cache.allocate(rid, hashes, len(tokens), len(tokens) + out)
    if cached is not None:
        cache.commit(rid)
        cache.free(rid)
    return cached


def test_only_full_blocks_are_hashed_and_hashes_chain() -> None:
    tokens = prompt(0, 40)
    hashes = block_hashes(tokens, BS)
    assert len(hashes) == 2  # 40 tokens = 2 full blocks + 8 leftover
    changed = block_hashes([999, *tokens[1:]], BS)
    assert changed[0] != hashes[0] and changed[1] != hashes[1], "block 1 must depend on block 0"
    assert block_hashes(tokens, BS) == hashes


def test_salt_changes_every_block_not_just_the_first() -> None:
    tokens = prompt(0, 64)
    plain, a, b = block_hashes(tokens, BS), block_hashes(tokens, BS, "tenant-a"), block_hashes(tokens, BS, "tenant-b")
    assert not set(plain) & set(a) and not set(a) & set(b)


def test_repeat_prompt_hits_full_blocks_and_recomputes_last_token() -> None:
    cache = PrefixCache(num_blocks=64, block_size=BS)
    tokens = prompt(0, 50)  # 3 full blocks
    assert run(cache, "r1", tokens) == 0
    assert run(cache, "r2", tokens) == 48
    exact = prompt(500, 48)  # exactly 3 blocks: the last token must be recomputed, so only 2 blocks hit
    run(cache, "r3", exact)
    assert run(cache, "r4", exact) == 32


def test_different_salts_never_share_blocks() -> None:
    cache = PrefixCache(num_blocks=64, block_size=BS)
    tokens = prompt(0, 100)
    run(cache, "a1", tokens, salt="a")
    assert run(cache, "b1", tokens, salt="b") == 0
    assert run(cache, "none", tokens) == 0
    assert run(cache, "a2", tokens, salt="a") == 96


def test_disabled_cache_never_hits() -> None:
    cache = PrefixCache(num_blocks=64, block_size=BS, enabled=False)
    tokens = prompt(0, 100)
    run(cache, "r1", tokens)
    assert run(cache, "r2", tokens) == 0


def test_running_requests_pin_blocks_and_full_pool_refuses() -> None:
    cache = PrefixCache(num_blocks=4, block_size=BS)
    first = prompt(0, 40)
    assert cache.allocate("r1", block_hashes(first, BS), 40, 48) == 0  # 3 blocks held
    assert cache.usage == 0.75
    other = prompt(1000, 20)
    assert cache.allocate("r2", block_hashes(other, BS), 20, 24) is None  # needs 2, only 1 free
    cache.free("r1")
    assert cache.usage == 0.0
    assert cache.allocate("r2", block_hashes(other, BS), 20, 24) == 0


def test_eviction_is_lru_and_frees_tails_first() -> None:
    cache = PrefixCache(num_blocks=6, block_size=BS)
    shared = prompt(0, 64)  # 4 full blocks, 4 blocks in use while running (no output room needed)
    hashes = block_hashes(shared, BS)
    assert cache.allocate("r1", hashes, 64, 64) == 0
    cache.commit("r1")
    cache.free("r1")
    # A newcomer needs 3 blocks: 2 never-used blocks, then the LRU free block, which is
    # r1's tail (freed first), so r1's first three blocks survive.
    newcomer = prompt(5000, 40)
    assert cache.allocate("r2", block_hashes(newcomer, BS), 40, 48) == 0
    cache.free("r2")
    longer = [*shared, *prompt(9000, 10)]  # could hit all 4 shared blocks if none were evicted
    assert cache.allocate("r3", block_hashes(longer, BS), len(longer), len(longer)) == 48


def test_reset_forgets_hashes() -> None:
    cache = PrefixCache(num_blocks=64, block_size=BS)
    tokens = prompt(0, 64)
    run(cache, "r1", tokens)
    cache.reset()
    assert run(cache, "r2", tokens) == 0
