"""The KV cache manager on its own: admit, allocate, grow, compute and free keep the pool, the
ledger and the block tables equal to a recount, and free gives everything back."""

from __future__ import annotations

import dataclasses

import pytest

from server.scheduler import PoolExhausted, PrefixSpec, Scheduler, SeqState
from server.scheduler.kvmanager import KVCacheManager
from server.scheduler.sequence import Sequence
from server.scheduler.view import SchedulerView
from tests.server.scheduler.helpers import FakeClock, req, small_config, tenants

BT = 16  # block_tokens of small_config


def manager(blocks: int = 20) -> KVCacheManager:
    return KVCacheManager(small_config(), blocks)


def sequence(
    kv: KVCacheManager, rid: str, prompt: int, max_new: int, reserve: bool, prefix: bool = False
) -> Sequence:
    r = req(rid, prompt=prompt, max_new=max_new)
    keys: list[bytes] = []
    if prefix:
        spec = PrefixSpec(prompt, True, "m", "t", "none", "chatml")
        keys = kv.prefix_keys(r.tenant, spec, r.prompt_tokens)
    need = kv.need_blocks(prompt, max_new)
    return Sequence(r, 1, max_new, need, keys, reserve, 0.0, 10.0)


def test_a_reserving_sequence_commits_its_worst_case_at_admit_and_gives_it_all_back() -> None:
    kv = manager()
    seq = sequence(kv, "r", prompt=40, max_new=40, reserve=True)  # 5 blocks worst case
    assert kv.start_commit(seq) == 5
    kv.admit(seq, SeqState.RUNNING)
    assert (kv.used_blocks, kv.committed_blocks) == (0, 5)
    assert kv.allocate_slots(seq, 40) == 40  # the whole prompt, plus its first output slot
    assert len(seq.blocks) == 3 and kv.committed_blocks == 5  # headroom became blocks in use
    kv.computed(seq, 41)
    while len(seq.blocks) < seq.need_blocks:
        assert kv.grow(seq)
    assert (kv.used_blocks, kv.committed_blocks) == (5, 5)
    kv.check()
    assert kv.free(seq, SeqState.FINISHED) == 5
    assert (kv.used_blocks, kv.committed_blocks, kv.settled_tokens) == (0, 0, 0)
    assert seq.blocks == [] and seq.kv_tokens == 0 and list(kv.holders()) == []
    assert kv.ledger.accounts["a"].reserved_tokens == 0
    kv.check()


def test_growing_past_a_reservation_is_the_pool_running_out() -> None:
    kv = manager(blocks=3)
    seq = sequence(kv, "r", prompt=16, max_new=16, reserve=True)  # 2 blocks worst case
    kv.admit(seq, SeqState.RUNNING)
    assert kv.allocate_slots(seq, 16) == 16 and len(seq.blocks) == seq.need_blocks == 2
    other = sequence(kv, "o", prompt=1, max_new=1, reserve=False)
    kv.admit(other, SeqState.RUNNING)
    assert kv.allocate_slots(other, 1) == 1 and kv.free_blocks == 0
    with pytest.raises(PoolExhausted, match="reservation of 2 blocks and all 3 are in use"):
        kv.grow(seq)


def test_a_non_reserving_sequence_finds_no_block_without_raising() -> None:
    kv = manager(blocks=2)
    seq = sequence(kv, "r", prompt=16, max_new=64, reserve=False)
    kv.admit(seq, SeqState.RUNNING)
    assert kv.allocate_slots(seq, 16) == 16 and len(seq.blocks) == 2
    assert kv.grow(seq) is False and len(seq.blocks) == 2
    kv.check()


def test_a_short_pool_gives_a_non_reserving_prefill_what_fits() -> None:
    kv = manager(blocks=2)
    seq = sequence(kv, "r", prompt=100, max_new=8, reserve=False)
    kv.admit(seq, SeqState.RUNNING)
    assert kv.allocate_slots(seq, 64) == 2 * BT  # all the pool holds
    kv.computed(seq, 2 * BT)
    assert kv.allocate_slots(seq, 32) == 0  # nothing left until a block is freed
    kv.check()


def test_computed_prefix_blocks_are_published_and_shared_by_the_next_start() -> None:
    kv = manager()
    first = sequence(kv, "x", prompt=48, max_new=4, reserve=True, prefix=True)
    kv.admit(first, SeqState.RUNNING)
    kv.allocate_slots(first, 48)
    kv.computed(first, 48)
    second = sequence(kv, "y", prompt=48, max_new=4, reserve=True, prefix=True)
    # A start always computes one token itself: two of the three prefix blocks hit.
    assert kv.cached_blocks(second) == 2
    assert kv.start_commit(second) == second.need_blocks - 2  # live hits cost nothing
    kv.admit(second, SeqState.RUNNING)
    assert second.blocks == first.blocks[:2] and second.cached_tokens == 2 * BT
    assert [kv.pool.ref_count(b) for b in first.blocks] == [2, 2, 1, 1]
    kv.free(first, SeqState.FINISHED)
    assert [kv.pool.ref_count(b) for b in second.blocks] == [1, 1]
    kv.check()


def test_the_view_reads_the_live_state_and_cannot_be_written() -> None:
    s = Scheduler(small_config(), tenants("a"), clock=FakeClock())
    s.submit(req("r", prompt=100, max_new=60))
    view = s.view
    assert isinstance(view, SchedulerView)
    assert view.committed_blocks == s.committed_blocks == 10 and view.running_count == 1
    assert [q.request_id for q in view.running()] == ["r"]
    s.cancel("r")
    assert view.committed_blocks == 0 and list(view.running()) == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        view._kv = s.kv  # type: ignore[misc]  # the write this test expects to be refused
