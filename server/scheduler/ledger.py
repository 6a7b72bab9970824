"""The tenant ledger: what each tenant (and each priority class) holds right now, kept
incrementally so admission and stats never walk the running set. The KV cache manager owns
it and alone changes its block and token sums; the scheduler counts queued demand and GPU
time through its methods."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from contract import Priority
from server.scheduler.sequence import Sequence

Snapshot = tuple[int, int, int, int, int]  # active, reserved tokens, commit blocks, headroom, ctx


@dataclass(slots=True)
class TenantAccount:
    """One tenant's sums over its block-holding sequences, plus its queued demand."""

    reserved_tokens: int = 0
    commit_blocks: int = 0
    active_seqs: int = 0
    queued_seqs: int = 0
    queued_tokens: int = 0
    gpu_banked: float = 0.0  # GPU seconds settled (prefill, and decoders that left)
    decoders: int = 0  # sequences of this tenant in the decode set
    decoder_marks: float = 0.0  # sum of their gpu_mark
    reserved_by_priority: Counter[Priority] = field(default_factory=Counter)
    contexts: Counter[int] = field(default_factory=Counter)

    @property
    def longest_context(self) -> int:
        return max(self.contexts, default=0)


class TenantLedger:
    """Invariant: every account equals the sum over that tenant's sequences that hold blocks
    (queued_* over its queued ones); `headroom_blocks` is the sum of all reserved-but-not-yet-
    allocated blocks, so pool commitments = blocks in use + headroom_blocks.

    GPU time of decoding sequences is metered lazily, so a decode step costs nothing per
    sequence: `meter` is the GPU time one sequence accrues by decoding every step since the
    start; a decoder's time is banked + (meter - its mark), and a tenant's is banked +
    decoders x meter - sum of marks.
    """

    def __init__(self) -> None:
        self.meter = 0.0
        self.accounts: dict[str, TenantAccount] = {}
        self.headroom_blocks = 0
        self.commit_by_priority: Counter[Priority] = Counter()
        self.running_by_priority: Counter[Priority] = Counter()

    def account(self, tenant: str) -> TenantAccount:
        acct = self.accounts.get(tenant)
        if acct is None:
            acct = self.accounts[tenant] = TenantAccount()
        return acct

    @staticmethod
    def snapshot(seq: Sequence) -> Snapshot:
        active = 1 if seq.holds_blocks else 0
        ctx = seq.prompt_len + seq.max_new if active else 0
        return active, seq.reserved_tokens, seq.commit_blocks, seq.headroom_blocks, ctx

    def apply(self, seq: Sequence, before: Snapshot) -> None:
        """Fold the change of `seq` since `before` (a snapshot) into the sums."""
        after = self.snapshot(seq)
        if after == before:
            return
        acct = self.account(seq.tenant)
        d_active = after[0] - before[0]
        d_tokens = after[1] - before[1]
        d_blocks = after[2] - before[2]
        acct.active_seqs += d_active
        acct.reserved_tokens += d_tokens
        acct.commit_blocks += d_blocks
        acct.reserved_by_priority[seq.priority] += d_tokens
        self.headroom_blocks += after[3] - before[3]
        self.commit_by_priority[seq.priority] += d_blocks
        self.running_by_priority[seq.priority] += d_active
        if before[4] != after[4]:
            if before[4]:
                acct.contexts[before[4]] -= 1
                if not acct.contexts[before[4]]:
                    del acct.contexts[before[4]]
            if after[4]:
                acct.contexts[after[4]] += 1

    def enqueue(self, seq: Sequence, sign: int) -> None:
        """Count (sign=1) or uncount (sign=-1) a queued sequence's worst-case demand."""
        acct = self.account(seq.tenant)
        acct.queued_seqs += sign
        acct.queued_tokens += sign * (seq.prompt_len + seq.max_new)

    def charge_gpu(self, seq: Sequence, seconds: float) -> None:
        """Charge work outside the decode meter (prefill chunks)."""
        seq.gpu_banked += seconds
        self.account(seq.tenant).gpu_banked += seconds

    def decode_enter(self, seq: Sequence) -> None:
        acct = self.account(seq.tenant)
        seq.gpu_mark = self.meter
        acct.decoders += 1
        acct.decoder_marks += self.meter

    def decode_leave(self, seq: Sequence) -> None:
        mark = seq.gpu_mark
        if mark is None:
            return
        acct = self.account(seq.tenant)
        seq.gpu_banked += self.meter - mark
        acct.gpu_banked += self.meter - mark
        acct.decoders -= 1
        acct.decoder_marks -= mark
        seq.gpu_mark = None

    def decode_skip(self, seq: Sequence, seconds: float) -> None:
        """A decoder left out of a step (token budget) must not accrue that step's time."""
        assert seq.gpu_mark is not None
        seq.gpu_mark += seconds
        self.account(seq.tenant).decoder_marks += seconds

    def seq_gpu_seconds(self, seq: Sequence) -> float:
        running = 0.0 if seq.gpu_mark is None else self.meter - seq.gpu_mark
        return seq.gpu_banked + running

    def gpu_seconds(self, tenant: str) -> float:
        acct = self.accounts.get(tenant)
        if acct is None:
            return 0.0
        return max(0.0, acct.gpu_banked + acct.decoders * self.meter - acct.decoder_marks)

    def expected(self, live: list[Sequence]) -> dict[str, tuple[int, int, int]]:
        """(reserved tokens, commit blocks, active seqs) per tenant recomputed from `live`."""
        out: dict[str, tuple[int, int, int]] = {t: (0, 0, 0) for t in self.accounts}
        for seq in live:
            tok, blk, act = out.get(seq.tenant, (0, 0, 0))
            out[seq.tenant] = (tok + seq.reserved_tokens, blk + seq.commit_blocks, act + 1)
        return out

    def check(self, live: list[Sequence]) -> None:
        """Assert the incremental sums equal a recount over `live` (tests; O(live))."""
        expected = self.expected(live)
        for tenant, acct in self.accounts.items():
            got = (acct.reserved_tokens, acct.commit_blocks, acct.active_seqs)
            assert got == expected[tenant], f"ledger drift for {tenant}: {got} != {expected}"
        assert self.headroom_blocks == sum(s.headroom_blocks for s in live)
        for tenant, acct in self.accounts.items():
            marks = [s.gpu_mark for s in live if s.tenant == tenant and s.gpu_mark is not None]
            assert acct.decoders == len(marks), f"decode meter drift for {tenant}"
            assert abs(acct.decoder_marks - sum(marks)) < 1e-6 * (1.0 + self.meter)
        for prio in Priority:
            assert self.running_by_priority[prio] == sum(1 for s in live if s.priority is prio)
