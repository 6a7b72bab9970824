"""One request's mutable scheduling state (the scheduler's private record of a SeqRequest)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from contract import Priority
from server.scheduler.types import SeqRequest, SeqState

if TYPE_CHECKING:
    from server.scheduler.decodeset import DecodeSet

_HOLDING = frozenset((SeqState.RUNNING, SeqState.RECOMPUTING))  # hot path: no enum property


class Sequence:
    """Token positions, blocks and the counters that must survive every state transition.

    `kv_tokens` positions have KV; prefill runs until `target` (the prompt, or prompt plus the
    output so far when a preempted sequence recomputes). While decoding, `generated` and
    `kv_tokens` advance lazily with the decode set's step count, so a decode step costs
    nothing per sequence. Invariants: generated <= max_new; kv_tokens <= capacity =
    len(blocks) * block_tokens. `deadline`, GPU time, `recomputes` and `preemptions` are
    never reset. The block table (`blocks`, `capacity`, `registered`, `cached_tokens`,
    `prefill_blocks`) is written only by the KV cache manager, and so are prefill positions.
    """

    __slots__ = (
        "arrival",
        "blocks",
        "cached_tokens",
        "capacity",
        "deadline",
        "decode_age_s",
        "dmark",
        "dset",
        "gen_settled",
        "gpu_banked",
        "gpu_mark",
        "kv_settled",
        "max_new",
        "need_blocks",
        "preemptions",
        "prefill_blocks",
        "prefix_keys",
        "priority",
        "prompt_len",
        "recomputes",
        "registered",
        "req",
        "request_id",
        "reserve_full",
        "state",
        "t_decode_start",
        "t_submit",
        "target",
        "tenant",
    )

    def __init__(
        self,
        req: SeqRequest,
        arrival: int,
        max_new: int,
        need_blocks: int,
        prefix_keys: list[bytes],
        reserve_full: bool,
        now: float,
        deadline: float,
    ) -> None:
        self.req = req
        self.request_id = req.request_id
        self.tenant = req.tenant
        self.priority: Priority = req.priority
        self.arrival = arrival  # queue order; kept across preemption so nobody jumps the queue
        self.prompt_len = len(req.prompt_tokens)
        self.max_new = max_new
        self.need_blocks = need_blocks  # worst case: blocks for prompt + max_new
        self.prefill_blocks = 0  # blocks for target + 1, set at each start
        self.prefix_keys = prefix_keys
        self.reserve_full = reserve_full
        self.state = SeqState.WAITING
        self.blocks: list[int] = []
        self.capacity = 0  # len(blocks) * block_tokens, kept to avoid recomputing per token
        self.kv_settled = 0
        self.gen_settled = 0
        self.dset: DecodeSet | None = None  # the decode set while decoding (lazy counters)
        self.dmark = 0  # dset.steps when kv/gen were last settled
        self.target = self.prompt_len
        self.registered = 0  # prefix blocks published to the cache so far
        self.cached_tokens = 0
        self.t_submit = now
        self.deadline = deadline
        self.t_decode_start: float | None = None
        self.decode_age_s = 0.0  # decode time banked before earlier preemptions
        self.gpu_banked = 0.0  # GPU seconds settled so far
        self.gpu_mark: float | None = None  # ledger's decode meter when it joined decoding
        self.recomputes = 0
        self.preemptions = 0

    @property
    def generated(self) -> int:
        """Output tokens so far; while decoding, one more per decode step since `dmark`."""
        d = self.dset
        return self.gen_settled if d is None else self.gen_settled + d.steps - self.dmark

    @generated.setter
    def generated(self, value: int) -> None:
        assert self.dset is None, "a decoding sequence advances only through its decode set"
        self.gen_settled = value

    @property
    def kv_tokens(self) -> int:
        """Positions with KV; while decoding, one more per decode step since `dmark`."""
        d = self.dset
        return self.kv_settled if d is None else self.kv_settled + d.steps - self.dmark

    @kv_tokens.setter
    def kv_tokens(self, value: int) -> None:
        assert self.dset is None, "a decoding sequence advances only through its decode set"
        self.kv_settled = value

    @property
    def replayable(self) -> bool:
        return self.req.replayable

    @property
    def holds_blocks(self) -> bool:
        return self.state in _HOLDING

    @property
    def held_tokens(self) -> int:
        return self.kv_tokens

    @property
    def prefilling(self) -> bool:
        return self.kv_tokens < self.target

    @property
    def reserved_tokens(self) -> int:
        """Input used plus output still allowed (worst case) for reserving policies; the slots
        of the blocks actually allocated for the others. Zero while holding no blocks."""
        if self.state not in _HOLDING:
            return 0
        if self.reserve_full:
            return self.prompt_len + self.max_new
        return self.capacity

    @property
    def commit_blocks(self) -> int:
        """Blocks this sequence is charged for in its tenant's share."""
        if self.state not in _HOLDING:
            return 0
        if self.reserve_full:
            return max(self.need_blocks, len(self.blocks))
        return len(self.blocks)

    @property
    def headroom_blocks(self) -> int:
        """Reserved blocks not yet allocated; shrinks to zero as output approaches its cap.
        Non-reserving policies reserve only the rest of the prefill (plus one output slot)."""
        if self.state not in _HOLDING:
            return 0
        if self.reserve_full:
            return max(0, self.need_blocks - len(self.blocks))
        if self.kv_tokens < self.target:
            return max(0, self.prefill_blocks - len(self.blocks))
        return 0

    def decode_age(self, now: float) -> float:
        """Seconds spent decoding, excluding prefill and queueing (V's first fix)."""
        if self.t_decode_start is None:
            return self.decode_age_s
        return self.decode_age_s + max(0.0, now - self.t_decode_start)
