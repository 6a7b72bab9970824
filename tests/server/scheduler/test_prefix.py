"""Block pool and prefix cache: ref counts, sharing rules, cold LRU reclaim."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from contract import Mutant
from server.scheduler import PrefixSpec, Scheduler
from server.scheduler.mutants import scheduler_class
from server.scheduler.pool import BlockPool, prefix_block_keys
from tests.server.scheduler.helpers import (
    FakeClock,
    check_invariants,
    req,
    small_config,
    step,
    tenants,
)

SYSTEM = tuple(range(500, 564))  # a 64-token system prompt: 4 full blocks


def spec(public: bool, **kw: Any) -> PrefixSpec:
    """The test's prefix; `kw` changes any of its fields (one per parametrized case)."""
    base = PrefixSpec(64, public, "llama-3-8b", "tok-v1", "none", "chatml")
    return dataclasses.replace(base, **kw)


def prompt(tail: int) -> tuple[int, ...]:
    return SYSTEM + tuple(range(tail, tail + 40))


def make(mutant: Mutant | None = None) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    return scheduler_class(mutant)(small_config(), tenants("a", "b"), clock=clock), clock


def warm(s: Scheduler, clock: FakeClock, rid: str, tenant: str, p: PrefixSpec) -> None:
    s.submit(req(rid, tenant, prompt=prompt(1), max_new=4, prefix=p))
    for _ in range(10):  # until its prompt is prefilled and the prefix blocks are published
        step(s, clock)
        if s.generated_tokens(rid):
            return
    raise AssertionError(f"{rid} did not finish prefill")


def test_private_prefix_never_hits_across_tenants_public_does() -> None:
    s, clock = make()
    warm(s, clock, "a1", "a", spec(public=False))
    same_tenant = s.submit(req("a2", "a", prompt=prompt(9), max_new=4, prefix=spec(False)))
    other_tenant = s.submit(req("b1", "b", prompt=prompt(9), max_new=4, prefix=spec(False)))
    assert same_tenant.cached_tokens == 64
    assert other_tenant.cached_tokens == 0
    assert s.cached_tokens("a2") == 64 and s.cached_tokens("b1") == 0

    warm(s, clock, "pa", "a", spec(public=True))
    public_hit = s.submit(req("pb", "b", prompt=prompt(9), max_new=4, prefix=spec(True)))
    assert public_hit.cached_tokens == 64
    check_invariants(s)


@pytest.mark.parametrize(
    "change",
    [
        {"model": "llama-3-70b"},
        {"tokenizer": "tok-v2"},
        {"adapter": "lora-x"},
        {"chat_template": "llama3"},
        {"permission_version": 1},
    ],
)
def test_key_covers_model_tokenizer_adapter_template_and_permissions(
    change: dict[str, object],
) -> None:
    base = prefix_block_keys("a", spec(False), SYSTEM, 16)
    assert len(base) == 4
    assert prefix_block_keys("a", spec(False, **change), SYSTEM, 16) != base
    assert prefix_block_keys("b", spec(False), SYSTEM, 16) != base
    changed_token = (SYSTEM[0] + 1, *SYSTEM[1:])
    assert prefix_block_keys("a", spec(False), changed_token, 16)[0] != base[0]
    assert prefix_block_keys("a", spec(True), SYSTEM, 16) == prefix_block_keys(
        "b", spec(True), SYSTEM, 16
    )


def test_shared_blocks_freed_only_at_ref_count_zero() -> None:
    s, clock = make()
    s.submit(req("x", "a", prompt=prompt(1), max_new=50, prefix=spec(True)))
    step(s, clock)
    step(s, clock)
    s.submit(req("y", "b", prompt=prompt(7), max_new=50, prefix=spec(True)))
    x, y = s.running_seq("x"), s.running_seq("y")
    assert x is not None and y is not None
    shared = x.blocks[:4]
    assert y.blocks[:4] == shared
    assert all(s.kv.pool.ref_count(b) == 2 for b in shared)
    s.cancel("x")
    assert all(s.kv.pool.ref_count(b) == 1 for b in shared)
    assert s.kv.pool.used == len(y.blocks)  # still in use by y
    s.cancel("y")
    assert s.kv.pool.used == 0 and s.stats().cached_free_blocks == 4
    check_invariants(s)


def test_prefix_hit_lowers_the_commitment() -> None:
    s, clock = make()
    s.submit(req("x", "a", prompt=prompt(1), max_new=50, prefix=spec(True)))
    step(s, clock)
    step(s, clock)
    before = s.committed_blocks
    s.submit(req("y", "b", prompt=prompt(7), max_new=50, prefix=spec(True)))
    # 154 tokens = 10 blocks, 4 of them already in use through x.
    assert s.committed_blocks - before == 6
    stats = s.stats()
    assert (stats.prefix_queries, stats.prefix_hits) == (2, 1)


def test_cold_blocks_are_reclaimed_lru_first() -> None:
    pool = BlockPool(4)
    a, b = pool.allocate(), pool.allocate()
    pool.register(a, b"key-a")
    pool.register(b, b"key-b")
    pool.release([a])  # a goes cold first: least recently used
    pool.release([b])
    assert pool.free == 4 and pool.cold == 2
    fresh = [pool.allocate(), pool.allocate()]  # plain free blocks are used before cold ones
    assert a not in fresh and b not in fresh and pool.cold == 2
    assert pool.allocate() == a and pool.cold_evictions == 1
    assert pool.peek([b"key-a"]) == (0, 0) and pool.peek([b"key-b"]) == (1, 0)
    pool.check()


def test_hit_on_a_cold_block_revives_it() -> None:
    pool = BlockPool(2)
    a = pool.allocate()
    pool.register(a, b"k")
    pool.release([a])
    assert pool.used == 0
    assert pool.acquire_prefix([b"k", b"missing"]) == [a]
    assert pool.used == 1 and pool.ref_count(a) == 1 and pool.cold == 0
    pool.check()


def test_release_more_than_referenced_is_caught() -> None:
    pool = BlockPool(2)
    a = pool.allocate()
    pool.release([a])
    with pytest.raises(AssertionError, match="released more often"):
        pool.release([a])


def test_the_shared_private_prefix_mutant_drops_only_the_tenant_from_private_keys() -> None:
    shared = make(Mutant.SHARED_PRIVATE_PREFIX)[0].kv
    private_a = shared.prefix_keys("a", spec(False), SYSTEM)
    assert private_a == shared.prefix_keys("b", spec(False), SYSTEM)
    assert private_a != prefix_block_keys("a", spec(False), SYSTEM, 16)
    # Everything else a private key carries still separates prefixes.
    changed = spec(False, permission_version=1)
    assert shared.prefix_keys("a", changed, SYSTEM) != private_a
    assert shared.prefix_keys("a", spec(True), SYSTEM) == prefix_block_keys(
        "a", spec(True), SYSTEM, 16
    )
    # Another mutant leaves the keys alone.
    assert make(Mutant.SLOW_RELEASE)[0].kv.prefix_keys("a", spec(False), SYSTEM) == (
        prefix_block_keys("a", spec(False), SYSTEM, 16)
    )


@pytest.mark.parametrize(
    ("mutant", "cross_tenant_hit"), [(None, 0), (Mutant.SHARED_PRIVATE_PREFIX, 64)]
)
def test_only_the_mutant_lets_another_tenant_hit_a_private_prefix(
    mutant: Mutant | None, cross_tenant_hit: int
) -> None:
    s, clock = make(mutant)
    warm(s, clock, "a1", "a", spec(public=False))
    probe = s.submit(req("b1", "b", prompt=prompt(9), max_new=4, prefix=spec(False)))
    assert probe.cached_tokens == s.cached_tokens("b1") == cross_tenant_hit
    assert (
        s.submit(req("a2", "a", prompt=prompt(9), max_new=4, prefix=spec(False))).cached_tokens
        == 64
    )
    check_invariants(s)
