"""The KV cache manager: the one allocation API over the block pool, with the tenant ledger
that prices every allocation and the block table of every sequence that holds blocks.

The scheduler decides who runs; this class does every allocate and free those decisions
imply, so the pool, the ledger's sums and the sequences' block tables cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence as Seq

from server.scheduler.config import SchedulerConfig
from server.scheduler.ledger import TenantLedger
from server.scheduler.pool import BlockPool, prefix_block_keys
from server.scheduler.sequence import Sequence
from server.scheduler.types import PoolExhausted, PrefixSpec, SeqState


class KVCacheManager:
    """Owns the block pool, the tenant ledger and each holder's block table: `blocks`,
    `capacity`, `registered` (prefix blocks published) and the KV positions written during
    prefill. Nothing else writes those fields or the ledger's block and token sums.

    Invariants: a sequence is a holder from `admit` to `free`, and only then has blocks;
    every block's ref count equals the number of holders listing it; the ledger's sums equal
    a recount over the holders; `settled_tokens` plus the decode set's lazy growth is the sum
    of the holders' kv_tokens. A reserving sequence commits its worst case at admit, so its
    later allocations turn headroom into blocks in use and never raise commitments.
    """

    def __init__(self, config: SchedulerConfig, num_blocks: int) -> None:
        self.config = config
        self.pool = BlockPool(num_blocks)
        self.ledger = TenantLedger()
        self.settled_tokens = 0  # sum of kv_tokens over holders, decoders' lazy share aside
        self._holders: dict[str, Sequence] = {}

    # ----- what the scheduler and its policies read -------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def used_blocks(self) -> int:
        return self.pool.used

    @property
    def free_blocks(self) -> int:
        """Blocks allocatable now: plain free ones and cold cached prefix blocks."""
        return self.pool.free

    @property
    def usage(self) -> float:
        return self.pool.used / self.pool.num_blocks

    @property
    def committed_blocks(self) -> int:
        """Blocks in use plus reserved headroom: the pool's worst-case future usage."""
        return self.pool.used + self.ledger.headroom_blocks

    def holders(self) -> Iterator[Sequence]:
        """Every sequence holding blocks, in the order it was admitted."""
        return iter(self._holders.values())

    def need_blocks(self, prompt_len: int, max_new: int) -> int:
        """A request's worst case: blocks for its whole prompt and every output token."""
        return self.config.blocks_for(prompt_len + max_new)

    def prefix_keys(self, tenant: str, spec: PrefixSpec, prompt: Seq[int]) -> list[bytes]:
        """Cache keys of the prefix's full blocks (see pool.prefix_block_keys)."""
        return prefix_block_keys(tenant, spec, prompt, self.config.block_tokens)

    def usable_prefix(self, seq: Sequence) -> list[bytes]:
        """Prefix keys a start may hit: at least one token is always left to compute."""
        return seq.prefix_keys[: (seq.target - 1) // self.config.block_tokens]

    def cached_blocks(self, seq: Sequence) -> int:
        """Blocks a start of `seq` now would take from the prefix cache."""
        return self.pool.peek(self.usable_prefix(seq))[0]

    def start_commit(self, seq: Sequence) -> int:
        """Blocks `seq` would add to commitments if it started now. Hits on blocks already in
        use cost nothing; a reserving sequence commits its worst case, any other one its
        prefill and first output token."""
        live_hits = self.pool.peek(self.usable_prefix(seq))[1]
        if seq.reserve_full:
            return seq.need_blocks - live_hits
        return self.config.blocks_for(seq.target + 1) - live_hits

    # ----- allocate and free ------------------------------------------------------------

    def admit(self, seq: Sequence, state: SeqState) -> None:
        """`seq` starts holding blocks in `state`: it takes its prefix-cache hits and its
        reservation (the ledger's headroom) now, and allocates the rest as it computes."""
        assert state.holds_blocks and not seq.blocks
        before = self.ledger.snapshot(seq)
        keys = self.usable_prefix(seq)
        seq.blocks = self.pool.acquire_prefix(keys) if keys else []
        seq.registered = len(seq.blocks)
        seq.kv_tokens = len(seq.blocks) * self.config.block_tokens
        seq.capacity = seq.kv_tokens
        seq.cached_tokens = min(seq.kv_tokens, seq.prompt_len)
        seq.prefill_blocks = self.config.blocks_for(seq.target + 1)
        seq.state = state
        self.settled_tokens += seq.kv_tokens
        self.ledger.apply(seq, before)
        self._holders[seq.request_id] = seq

    def allocate_slots(self, seq: Sequence, tokens: int) -> int:
        """Blocks for the next `tokens` prefill positions, plus the first output token's when
        they complete the prompt. Returns how many positions got room: fewer only when a
        non-reserving sequence finds the pool short."""
        bt = self.config.block_tokens
        room = seq.capacity + self.pool.free * bt - seq.kv_tokens
        if seq.kv_tokens + tokens == seq.target and room < tokens + 1:
            tokens -= 1  # the completing chunk needs a slot for its output token
        tokens = min(tokens, room)
        if tokens <= 0:
            return 0
        extra = 1 if seq.kv_tokens + tokens == seq.target else 0
        missing = self.config.blocks_for(seq.kv_tokens + tokens + extra) - len(seq.blocks)
        if missing > 0:
            before = self.ledger.snapshot(seq)
            for _ in range(missing):
                seq.blocks.append(self.pool.allocate())
            seq.capacity = len(seq.blocks) * bt
            self.ledger.apply(seq, before)
        return tokens

    def grow(self, seq: Sequence) -> bool:
        """One more block for a decoder's next token. False when a non-reserving sequence
        finds no free block; a reserving one past its reservation raises PoolExhausted."""
        if seq.reserve_full and len(seq.blocks) < seq.need_blocks:
            # Within its reservation: headroom turns into a block in use, commitments unchanged.
            seq.blocks.append(self.pool.allocate())
            seq.capacity += self.config.block_tokens
            self.ledger.headroom_blocks -= 1
            return True
        if not self.pool.free:
            if seq.reserve_full:
                # Only a wrong reservation gets here: the engine trusted it and has no block
                # for a token it is already computing.
                raise PoolExhausted(
                    f"KV cache out of blocks: request {seq.request_id} grew past its "
                    f"reservation of {seq.need_blocks} blocks and all {self.pool.num_blocks} "
                    f"are in use"
                )
            return False
        before = self.ledger.snapshot(seq)
        seq.blocks.append(self.pool.allocate())
        seq.capacity += self.config.block_tokens
        self.ledger.apply(seq, before)
        return True

    def computed(self, seq: Sequence, tokens: int) -> None:
        """The engine wrote KV for `tokens` more positions of a sequence outside the decode
        set; prefix blocks it completed are published to the cache."""
        before = self.ledger.snapshot(seq)
        seq.kv_tokens += tokens
        self.settled_tokens += tokens
        upto = min(len(seq.prefix_keys), seq.kv_tokens // self.config.block_tokens)
        for i in range(seq.registered, upto):
            self.pool.register(seq.blocks[i], seq.prefix_keys[i])
        seq.registered = max(seq.registered, upto)
        self.ledger.apply(seq, before)

    def free(self, seq: Sequence, state: SeqState) -> int:
        """Drop every block reference `seq` holds (none for a queued one) and its reservation
        with them; it ends in `state`. Returns the references released."""
        assert not state.holds_blocks and seq.dset is None
        before = self.ledger.snapshot(seq)
        refs = len(seq.blocks)
        self.pool.release(seq.blocks)
        self.settled_tokens -= seq.kv_tokens
        seq.blocks, seq.capacity, seq.kv_tokens, seq.registered = [], 0, 0, 0
        seq.state = state
        self.ledger.apply(seq, before)
        self._holders.pop(seq.request_id, None)
        return refs

    def check(self) -> None:
        """Assert every invariant above against a full recount (tests only; O(pool))."""
        self.pool.check()
        live = list(self._holders.values())
        self.ledger.check(live)
        refs: dict[int, int] = {}
        for seq in live:
            assert seq.holds_blocks, f"{seq.request_id} is a holder in state {seq.state}"
            assert seq.kv_tokens <= seq.capacity == len(seq.blocks) * self.config.block_tokens
            for b in seq.blocks:
                refs[b] = refs.get(b, 0) + 1
        for b, n in refs.items():
            held = self.pool.ref_count(b)
            assert held == n, f"block {b}: ref count {held} but {n} holders"
        assert self.pool.used == len(refs)
