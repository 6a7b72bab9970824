"""The scheduler facade: admission, cancellation, state transitions and their event log.

The step itself (schedule and commit) lives in `step.py`; this module owns the shared state
and every transition, so each transition records exactly one event.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace

from contract import EventKind, Mutant, Priority, RejectCode
from server.scheduler import step
from server.scheduler.admission import (
    deadline_rejection,
    reject,
    screen,
    soft_overage_rejection,
)
from server.scheduler.config import SchedulerConfig, TenantQuota
from server.scheduler.decodeset import DecodeSet
from server.scheduler.ledger import TenantLedger
from server.scheduler.mutants import LEAK_EVERY
from server.scheduler.policies import make_policy
from server.scheduler.pool import BlockPool, prefix_block_keys
from server.scheduler.sequence import Sequence
from server.scheduler.stats import collect_stats
from server.scheduler.types import (
    Admission,
    Decision,
    Event,
    SchedulerStats,
    SeqRequest,
    SeqState,
    StepPlan,
)
from server.scheduler.waitqueue import WaitQueue

FINISHED_MEMORY = 4096  # finished sequences remembered for state()/generated_tokens()


class Scheduler:
    """Decides, step by step, which sequences hold KV blocks and what the engine computes.

    What each watermark compares (usage = blocks in use / pool; commitments = blocks in use +
    reserved-but-unallocated headroom, so commitments >= usage):
    - admission_watermark vs usage: above it, long batch requests do not start (they queue);
    - batch_prefill_pause_watermark vs usage: above it, batch prefill pauses (decode goes on);
    - hard_watermark vs commitments: non-critical work starts only if commitments stay at or
      below it; critical work may start past it by what running batch work commits, and the
      excess is reclaimed by preemption in the same step; streamed interactive and critical
      work is preempted only when usage itself is above it (the process is at risk).
    tenant_max_share caps each tenant's committed blocks; interactive_reserve caps batch's.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        tenants: Mapping[str, TenantQuota],
        policy: str = "seed",
        clock: Callable[[], float] = time.monotonic,
        device_free_bytes: int | None = None,
        mutant: Mutant | None = None,
    ) -> None:
        self.config = config
        self.mutant = mutant  # a named bug this scheduler carries on purpose (None: correct)
        self.tenants = dict(tenants)
        self.policy = make_policy(policy)
        self.clock = clock
        self.pool = BlockPool(self.policy.pool_blocks(config, device_free_bytes))
        self.ledger = TenantLedger()
        self.queue = WaitQueue()
        self.share_cap_blocks = int(config.tenant_max_share * self.pool.num_blocks)
        self._running: dict[str, Sequence] = {}
        self.prefilling: dict[Priority, dict[str, Sequence]] = {p: {} for p in Priority}
        self.decoding = DecodeSet(self.ledger)
        self.starved: dict[str, Sequence] = {}  # non-reserving policies: no block for next token
        self._finished: OrderedDict[str, Sequence] = OrderedDict()
        self._arrivals = 0
        self._events: list[Event] = []
        # the plan handed out, when, and the decoders its token budget left out
        self.inflight: tuple[StepPlan, float, list[Sequence]] | None = None
        self.rejected: Counter[tuple[str, str, str]] = Counter()
        self.rejected_tokens: Counter[str] = Counter()
        self.evictions: Counter[str] = Counter()
        self.preemptions: Counter[Priority] = Counter()
        self.recomputes = 0
        self.kv_settled = 0  # settled part of the sum of kv_tokens over live sequences
        self._finish_times: deque[float] = deque(maxlen=256)  # recent finishes, for wait estimates
        # Mutant leak_on_cancel: cancelled sequences that still hold their blocks, forever.
        self.leaked: dict[str, Sequence] = {}
        self._cancels = 0

    # ----- public API -------------------------------------------------------------------

    @property
    def pool_blocks(self) -> int:
        return self.pool.num_blocks

    def submit(self, req: SeqRequest) -> Admission:
        """ADMIT: runs from the next schedule(); QUEUE: waits until its deadline; REJECT."""
        if req.request_id in self._running or req.request_id in self.queue:
            raise ValueError(f"request id {req.request_id!r} is already live; ids must be unique")
        if not req.prompt_tokens:
            raise ValueError(f"request {req.request_id!r} has an empty prompt")
        if req.max_new_tokens is not None and req.max_new_tokens < 1:
            raise ValueError(f"request {req.request_id!r}: max_new_tokens must be at least 1")
        seq = self._new_sequence(req)
        verdict = screen(self, seq)
        if verdict is not None:
            self._record_reject(seq, verdict)
            return verdict
        skips_queue = self.batch_ignores_pressure and seq.priority is Priority.BATCH
        if (skips_queue or self._nothing_ahead(seq)) and step.try_start(self, seq):
            msg = "admitted"
            cached = seq.cached_tokens
            return Admission(Decision.ADMIT, None, 200, None, msg, None, seq.max_new, cached)
        if (
            self.policy.bounded_queue
            and len(self.queue) >= self.config.max_queued
            and not self._parks(seq)
        ):
            wait = self.estimated_wait(seq.priority)
            verdict = reject(
                RejectCode.CAPACITY,
                f"the replica is full and its queue holds {len(self.queue)} requests (the "
                f"limit); retry in about {max(1, round(wait))} s",
                seq.max_new,
                wait,
            )
            self._record_reject(seq, verdict)
            return verdict
        self._enqueue(seq)
        self._event(seq, EventKind.QUEUED, None)
        cached = self.pool.peek(self.usable_prefix(seq))[0] * self.config.block_tokens
        deadline = seq.deadline if self.policy.bounded_queue else None
        msg = "queued until capacity frees"
        return Admission(Decision.QUEUE, None, 200, None, msg, deadline, seq.max_new, cached)

    def cancel(self, request_id: str, reason: str = "client_disconnect") -> int:
        """Cancel a live request now; returns the block references released (0 if unknown)."""
        seq = self._running.get(request_id)
        if seq is not None:
            if self._leaks_on_cancel():
                self._leak(seq, reason)
                return 0
            return self.release(seq, EventKind.CANCELLED, reason)
        if request_id in self.queue:
            seq = self._dequeue_by_id(request_id)
            return self.release(seq, EventKind.CANCELLED, reason)
        return 0

    def schedule(self, token_budget: int | None = None) -> StepPlan:
        return step.schedule(self, token_budget or self.config.step_token_budget)

    def commit(self, plan: StepPlan, finished: Iterable[str] = ()) -> None:
        """The engine ran `plan` (the last one schedule() returned). Ids cancelled while it was
        in flight, and unknown ids in `finished`, are skipped silently."""
        step.commit(self, plan, finished)

    def drain_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def generated_tokens(self, request_id: str) -> int:
        seq = self._lookup(request_id)
        return 0 if seq is None else seq.generated

    def cached_tokens(self, request_id: str) -> int:
        """Prompt tokens served from the prefix cache at the request's (latest) start."""
        seq = self._lookup(request_id)
        return 0 if seq is None else seq.cached_tokens

    def gpu_seconds(self, request_id: str) -> float:
        """GPU time the request has used so far (it survives preemption and recompute)."""
        seq = self._lookup(request_id)
        return 0.0 if seq is None else self.ledger.seq_gpu_seconds(seq)

    def state(self, request_id: str) -> SeqState | None:
        seq = self._lookup(request_id)
        return None if seq is None else seq.state

    def stats(self) -> SchedulerStats:
        return collect_stats(self)

    # ----- views the policies and the step read -----------------------------------------

    @property
    def running_count(self) -> int:
        return len(self._running)

    def running(self) -> Iterator[Sequence]:
        return iter(self._running.values())

    @property
    def kv_tokens_total(self) -> int:
        """Sum of kv_tokens over block-holding sequences (decoders' share kept lazily)."""
        return self.kv_settled + self.decoding.settled_kv + self.decoding.pending_kv

    @property
    def committed_blocks(self) -> int:
        """Blocks in use plus reserved headroom: the pool's worst-case future usage."""
        committed = self.pool.used + self.ledger.headroom_blocks
        if self.mutant is Mutant.UNDERESTIMATE_KV:  # the bug: only the estimate is counted
            committed -= sum(max(0, len(q.blocks) - q.need_blocks) for q in self._running.values())
        return committed

    @property
    def usage(self) -> float:
        return self.pool.used / self.pool.num_blocks

    @property
    def at_risk(self) -> bool:
        """Usage itself is above the hard watermark: the process could run out of memory."""
        return self.usage > self.config.hard_watermark

    @property
    def batch_ignores_pressure(self) -> bool:
        """Mutant batch_ignores_peak: batch work skips the queue's priority order and the
        pressure ladder's batch rules, and starts whenever it fits in the pool."""
        return self.mutant is Mutant.BATCH_IGNORES_PEAK

    def over_soft_quota(self, tenant: str) -> bool:
        quota = self.tenants.get(tenant)
        acct = self.ledger.accounts.get(tenant)
        if quota is None or acct is None:
            return False
        return acct.reserved_tokens > quota.soft_reserved_tokens

    def start_ceiling(self, seq: Sequence) -> int:
        """Most blocks one request of this class could ever commit on an idle replica."""
        pool = self.pool.num_blocks
        if not self.policy.enforce_quotas or seq.priority is Priority.CRITICAL:
            return pool
        ceiling = int((self.config.hard_watermark - self.config.critical_reserve) * pool)
        if seq.priority is Priority.BATCH:
            ceiling = min(ceiling, int((1.0 - self.config.interactive_reserve) * pool))
        return ceiling

    def usable_prefix(self, seq: Sequence) -> list[bytes]:
        """Prefix keys a start may hit: at least one token is always left to compute."""
        return seq.prefix_keys[: (seq.target - 1) // self.config.block_tokens]

    @property
    def enforces_share_cap(self) -> bool:
        return self.mutant is not Mutant.NO_TENANT_CAP  # the bug: the cap is never checked

    def tenant_fits(self, seq: Sequence) -> bool:
        if not self.enforces_share_cap:
            return True
        acct = self.ledger.account(seq.tenant)
        return acct.commit_blocks + seq.need_blocks <= self.share_cap_blocks

    @property
    def finish_rate(self) -> float:
        """Requests finished per second over the recent finishes (0 before two of them)."""
        times = self._finish_times
        span = times[-1] - times[0] if len(times) > 1 else 0.0
        return (len(times) - 1) / span if span > 0 else 0.0

    def estimated_wait(self, priority: Priority) -> float:
        """Seconds until a new request of this class would start, from the recent finish rate."""
        rank = self.policy.rank(priority)
        ahead = sum(n for p, n in self.queue.by_priority.items() if self.policy.rank(p) <= rank)
        if ahead == 0:
            return 0.0
        rate = max(self.finish_rate, 0.1)  # floor: an idle replica still promises progress
        return min(ahead / rate, self.config.queue_deadline_ms / 1000.0)

    # ----- transitions (each records its event) -----------------------------------------

    def start(self, seq: Sequence) -> None:
        """Queue -> holding blocks: take prefix-cache hits and the ledger reservation."""
        before = self.ledger.snapshot(seq)
        resumed = seq.state is SeqState.PREEMPTED
        bt = self.config.block_tokens
        keys = self.usable_prefix(seq)
        seq.blocks = self.pool.acquire_prefix(keys) if keys else []
        seq.registered = len(seq.blocks)
        seq.kv_tokens = len(seq.blocks) * bt
        seq.capacity = seq.kv_tokens
        seq.cached_tokens = min(seq.kv_tokens, seq.prompt_len)
        seq.prefill_blocks = self.config.blocks_for(seq.target + 1)
        seq.state = SeqState.RECOMPUTING if resumed else SeqState.RUNNING
        self.kv_settled += seq.kv_tokens
        self.ledger.apply(seq, before)
        self._running[seq.request_id] = seq
        self.prefilling[seq.priority][seq.request_id] = seq
        if resumed:
            seq.recomputes += 1
            self.recomputes += 1
        self._event(seq, EventKind.RESUMED if resumed else EventKind.ADMITTED, None)

    def preempt(self, seq: Sequence, reason: str) -> None:
        """Drop a running sequence's KV; it requeues at its arrival position to recompute."""
        before = self.ledger.snapshot(seq)
        self._detach(seq)
        self.pool.release(seq.blocks)
        self.kv_settled -= seq.kv_tokens
        seq.blocks, seq.capacity, seq.kv_tokens, seq.registered = [], 0, 0, 0
        seq.target = seq.prompt_len + seq.generated
        seq.decode_age_s = seq.decode_age(self.clock())
        seq.t_decode_start = None
        seq.preemptions += 1
        seq.state = SeqState.PREEMPTED
        self.ledger.apply(seq, before)
        self._enqueue(seq)
        self.preemptions[seq.priority] += 1
        self.evictions[reason] += 1
        self._event(seq, EventKind.PREEMPTED, reason)
        if self.mutant is Mutant.DROP_PREEMPTED:  # the bug: abort instead of resuming later
            dropped = self._dequeue_by_id(seq.request_id)
            self.release(dropped, EventKind.CANCELLED, "preempted_dropped")

    def release(self, seq: Sequence, event: EventKind, reason: str | None) -> int:
        """Finish or cancel: free every block reference now; records `event` and 'released'."""
        self._event(seq, event, reason)  # still showing what it held when it ended
        before = self.ledger.snapshot(seq)
        if seq.state.holds_blocks:
            self._detach(seq)
        refs = len(seq.blocks)
        self.pool.release(seq.blocks)
        self.kv_settled -= seq.kv_tokens
        seq.blocks, seq.capacity = [], 0
        seq.state = SeqState.FINISHED
        self.ledger.apply(seq, before)
        self._remember(seq)
        self._event(seq, EventKind.RELEASED, reason, blocks=refs)
        if event is EventKind.FINISHED:
            self._finish_times.append(self.clock())
        return refs

    def expire(self, seq: Sequence) -> Admission:
        """A queued request whose deadline passed: rejected (503), never left to time out."""
        verdict = deadline_rejection(self, seq)
        self._queue_reject(seq, verdict)
        return verdict

    def shed_soft_overage(self) -> list[tuple[str, Admission]]:
        """Tier 2: reject queued, never-started requests of tenants over their soft quota."""
        shed = []
        for seq in self.queue:
            if seq.state is SeqState.WAITING and self.over_soft_quota(seq.tenant):
                self.queue.remove(seq)
                verdict = soft_overage_rejection(self, seq)
                self._queue_reject(seq, verdict)
                self.evictions["soft_quota_queued"] += 1
                shed.append((seq.request_id, verdict))
        return shed

    def _queue_reject(self, seq: Sequence, verdict: Admission) -> None:
        """Finish a sequence just taken off the queue with a rejection."""
        self.ledger.enqueue(seq, -1)
        seq.state = SeqState.FINISHED
        self._remember(seq)
        self._record_reject(seq, verdict)

    def requeue(self, seq: Sequence) -> None:
        """Put back a sequence taken off the queue that could not start yet."""
        self._enqueue(seq)

    def take_next(self) -> Sequence | None:
        """The next queued sequence in service order (the caller starts or requeues it)."""
        seq = self.queue.pop_next()
        if seq is not None:
            self.ledger.enqueue(seq, -1)
        return seq

    def running_seq(self, request_id: str) -> Sequence | None:
        return self._running.get(request_id)

    def live(self) -> list[Sequence]:
        """Every sequence holding blocks (for invariant checks), leaked ones included."""
        return [*self._running.values(), *self.leaked.values()]

    # ----- internals ---------------------------------------------------------------------

    def _new_sequence(self, req: SeqRequest) -> Sequence:
        cfg = self.config
        max_new = req.max_new_tokens or cfg.max_new_tokens_default
        keys = []
        if req.prefix is not None and req.prefix.length >= cfg.block_tokens:
            keys = prefix_block_keys(
                req.tenant, req.prefix, req.prompt_tokens, cfg.block_tokens, self.mutant
            )
        now = self.clock()
        deadline_ms = req.deadline_ms if req.deadline_ms is not None else cfg.queue_deadline_ms
        self._arrivals += 1
        need = cfg.blocks_for(len(req.prompt_tokens) + max_new)
        if self.mutant is Mutant.UNDERESTIMATE_KV:  # the bug: no room for the output
            need = cfg.blocks_for(len(req.prompt_tokens) + 1)
        reserve = self.policy.reserve_full
        seq = Sequence(
            req, self._arrivals, max_new, need, keys, reserve, now, now + deadline_ms / 1000
        )
        if self._parks(seq):
            seq.deadline = float("inf")
        return seq

    def _parks(self, seq: Sequence) -> bool:
        """Mutant queue_instead_of_refuse: low-priority work waits with no deadline or bound."""
        return self.mutant is Mutant.QUEUE_INSTEAD_OF_REFUSE and seq.priority is Priority.BATCH

    def _nothing_ahead(self, seq: Sequence) -> bool:
        rank = self.policy.rank(seq.priority)
        return all(n == 0 for p, n in self.queue.by_priority.items() if self.policy.rank(p) <= rank)

    def _enqueue(self, seq: Sequence) -> None:
        self.queue.push(seq, self.policy.rank(seq.priority))
        self.ledger.enqueue(seq, 1)

    def _dequeue_by_id(self, request_id: str) -> Sequence:
        seq = self.queue.get(request_id)
        assert seq is not None
        self.queue.remove(seq)
        self.ledger.enqueue(seq, -1)
        return seq

    def _detach(self, seq: Sequence) -> None:
        rid = seq.request_id
        del self._running[rid]
        self.prefilling[seq.priority].pop(rid, None)
        self.decoding.discard(rid)
        self.starved.pop(rid, None)

    def _leaks_on_cancel(self) -> bool:
        if self.mutant is not Mutant.LEAK_ON_CANCEL:
            return False
        self._cancels += 1
        return self._cancels % LEAK_EVERY == 0

    def _leak(self, seq: Sequence, reason: str) -> None:
        """Mutant leak_on_cancel: the sequence stops running and is forgotten, but its blocks
        and reservation are never returned (no 'released' event ever follows)."""
        self._event(seq, EventKind.CANCELLED, reason)
        self._detach(seq)
        self.leaked[seq.request_id] = seq

    def _remember(self, seq: Sequence) -> None:
        """Keep a finished sequence for its counters (state, generated, GPU time), without its
        prompt: FINISHED_MEMORY sequences each holding up to 32K token ids and their block
        keys are hundreds of MB to gigabytes a replica never gives back (the soak's server
        RSS drift gate found it)."""
        seq.req = replace(seq.req, prompt_tokens=())
        seq.prefix_keys = []
        self._finished[seq.request_id] = seq
        if len(self._finished) > FINISHED_MEMORY:
            self._finished.popitem(last=False)

    def _lookup(self, request_id: str) -> Sequence | None:
        seq = self._running.get(request_id)
        if seq is None:
            seq = self.queue.get(request_id)
        return seq if seq is not None else self._finished.get(request_id)

    def _record_reject(self, seq: Sequence, verdict: Admission) -> None:
        reason = verdict.reason.value if verdict.reason else "unknown"
        self.rejected[(reason, seq.priority.value, seq.tenant)] += 1
        self.rejected_tokens[reason] += seq.prompt_len + seq.max_new
        self._event(seq, EventKind.REJECTED, reason)

    def _event(self, seq: Sequence, kind: EventKind, reason: str | None, blocks: int = -1) -> None:
        self._events.append(
            Event(
                t=self.clock(),
                request_id=seq.request_id,
                tenant=seq.tenant,
                priority=seq.priority,
                event=kind,
                blocks=len(seq.blocks) if blocks < 0 else blocks,
                reserved_tokens=seq.reserved_tokens,
                used_tokens=seq.kv_tokens if seq.state.holds_blocks else 0,
                reason=reason,
                pool_used_blocks=self.pool.used,
                pool_total_blocks=self.pool.num_blocks,
            )
        )
