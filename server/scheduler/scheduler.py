"""The scheduler facade: admission, cancellation, state transitions and their event log.

The step itself (schedule and commit) lives in `step.py`; this module owns the shared state
and every transition, so each transition records exactly one event.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import ClassVar

from contract import EventKind, Priority, RejectCode
from server.scheduler import step
from server.scheduler.admission import (
    deadline_rejection,
    reject,
    screen,
    soft_overage_rejection,
)
from server.scheduler.config import SchedulerConfig, TenantQuota
from server.scheduler.decodeset import DecodeSet
from server.scheduler.kvmanager import KVCacheManager
from server.scheduler.policies import POLICIES, Policy, make_policy
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
from server.scheduler.view import SchedulerView, SeqView

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

    It owns the sequences' states, the wait queue (the policy's queue type), the decode set
    and the event log; every allocate and free goes through the KV cache manager `kv`, and
    the policy reads the scheduler only through `view`.
    """

    # The parts a subclass may replace; the mutants (server.scheduler.mutants) do.
    kv_manager_type: ClassVar[type[KVCacheManager]] = KVCacheManager
    policy_types: ClassVar[Mapping[str, type[Policy]]] = POLICIES

    def __init__(
        self,
        config: SchedulerConfig,
        tenants: Mapping[str, TenantQuota],
        policy: str = "seed",
        clock: Callable[[], float] = time.monotonic,
        device_free_bytes: int | None = None,
    ) -> None:
        self.config = config
        self.tenants = dict(tenants)
        self.policy = make_policy(policy, self.policy_types)
        self.clock = clock
        self.kv = self.kv_manager_type(config, self.policy.pool_blocks(config, device_free_bytes))
        self.queue = self.policy.queue_type(config)
        self.view = SchedulerView(self, self.kv)
        self.share_cap_blocks = int(config.tenant_max_share * self.kv.num_blocks)
        self._running: dict[str, Sequence] = {}
        self.prefilling: dict[Priority, dict[str, Sequence]] = {p: {} for p in Priority}
        self.decoding = DecodeSet(self.kv.ledger)
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
        self._finish_times: deque[float] = deque(maxlen=256)  # recent finishes, for wait estimates

    # ----- public API -------------------------------------------------------------------

    @property
    def pool_blocks(self) -> int:
        return self.kv.num_blocks

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
        if self.may_start_on_arrival(seq) and step.try_start(self, seq):
            msg = "admitted"
            cached = seq.cached_tokens
            return Admission(Decision.ADMIT, None, 200, None, msg, None, seq.max_new, cached)
        if not self.queue.has_room(seq):
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
        cached = self.kv.cached_blocks(seq) * self.config.block_tokens
        deadline = self.queue.deadline(seq)
        msg = "queued until capacity frees"
        return Admission(Decision.QUEUE, None, 200, None, msg, deadline, seq.max_new, cached)

    def cancel(self, request_id: str, reason: str = "client_disconnect") -> int:
        """Cancel a live request now; returns the block references released (0 if unknown)."""
        seq = self._running.get(request_id)
        if seq is not None:
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
        return 0.0 if seq is None else self.kv.ledger.seq_gpu_seconds(seq)

    def state(self, request_id: str) -> SeqState | None:
        seq = self._lookup(request_id)
        return None if seq is None else seq.state

    def stats(self) -> SchedulerStats:
        return collect_stats(self)

    # ----- what the step, admission and the view read -----------------------------------

    @property
    def running_count(self) -> int:
        return len(self._running)

    def running(self) -> Iterator[Sequence]:
        return iter(self._running.values())

    @property
    def kv_tokens_total(self) -> int:
        """Sum of kv_tokens over block-holding sequences (decoders' share kept lazily)."""
        return self.kv.settled_tokens + self.decoding.settled_kv + self.decoding.pending_kv

    @property
    def committed_blocks(self) -> int:
        """Blocks in use plus reserved headroom: the pool's worst-case future usage."""
        return self.kv.committed_blocks

    @property
    def usage(self) -> float:
        return self.kv.usage

    @property
    def at_risk(self) -> bool:
        """Usage itself is above the hard watermark: the process could run out of memory."""
        return self.kv.usage > self.config.hard_watermark

    def may_start_on_arrival(self, seq: Sequence) -> bool:
        """A new request tries to start before it queues only when nothing it would be
        served after is queued: nobody jumps the queue."""
        return self.queue.ahead(seq.priority) == 0

    def start_past_blocked_head(self, aside: list[Sequence]) -> list[str]:
        """After a queued sequence was BLOCKED (the pool is full), start what may still
        start behind it and return their ids; sequences taken off the queue and not started
        go to `aside`, which the caller requeues. The shipped rule starts nothing: a blocked
        head holds back everything behind it."""
        return []

    def over_soft_quota(self, tenant: str) -> bool:
        quota = self.tenants.get(tenant)
        acct = self.kv.ledger.accounts.get(tenant)
        if quota is None or acct is None:
            return False
        return acct.reserved_tokens > quota.soft_reserved_tokens

    def start_ceiling(self, seq: Sequence) -> int:
        """Most blocks one request of this class could ever commit on an idle replica."""
        pool = self.kv.num_blocks
        if not self.policy.enforce_quotas or seq.priority is Priority.CRITICAL:
            return pool
        ceiling = int((self.config.hard_watermark - self.config.critical_reserve) * pool)
        if seq.priority is Priority.BATCH:
            ceiling = min(ceiling, int((1.0 - self.config.interactive_reserve) * pool))
        return ceiling

    def tenant_fits(self, seq: SeqView) -> bool:
        """Committing `seq`'s worst case keeps its tenant within tenant_max_share."""
        acct = self.kv.ledger.account(seq.tenant)
        return acct.commit_blocks + seq.need_blocks <= self.share_cap_blocks

    @property
    def finish_rate(self) -> float:
        """Requests finished per second over the recent finishes (0 before two of them)."""
        times = self._finish_times
        span = times[-1] - times[0] if len(times) > 1 else 0.0
        return (len(times) - 1) / span if span > 0 else 0.0

    def estimated_wait(self, priority: Priority) -> float:
        """Seconds until a new request of this class would start, from the recent finish rate."""
        ahead = self.queue.ahead(priority)
        if ahead == 0:
            return 0.0
        rate = max(self.finish_rate, 0.1)  # floor: an idle replica still promises progress
        return min(ahead / rate, self.config.queue_deadline_ms / 1000.0)

    # ----- transitions (each records its event) -----------------------------------------

    def start(self, seq: Sequence) -> None:
        """Queue -> holding blocks: take prefix-cache hits and the ledger reservation."""
        resumed = seq.state is SeqState.PREEMPTED
        self.kv.admit(seq, SeqState.RECOMPUTING if resumed else SeqState.RUNNING)
        self._running[seq.request_id] = seq
        self.prefilling[seq.priority][seq.request_id] = seq
        if resumed:
            seq.recomputes += 1
            self.recomputes += 1
        self._event(seq, EventKind.RESUMED if resumed else EventKind.ADMITTED, None)

    def preempt(self, seq: Sequence, reason: str) -> None:
        """Drop a running sequence's KV; it requeues at its arrival position to recompute."""
        self._detach(seq)
        self.kv.free(seq, SeqState.PREEMPTED)
        seq.target = seq.prompt_len + seq.generated
        seq.decode_age_s = seq.decode_age(self.clock())
        seq.t_decode_start = None
        seq.preemptions += 1
        self._enqueue(seq)
        self.preemptions[seq.priority] += 1
        self.evictions[reason] += 1
        self._event(seq, EventKind.PREEMPTED, reason)

    def release(self, seq: Sequence, event: EventKind, reason: str | None) -> int:
        """Finish or cancel: free every block reference now; records `event` and 'released'."""
        self._event(seq, event, reason)  # still showing what it held when it ended
        if seq.state.holds_blocks:
            self._detach(seq)
        refs = self.kv.free(seq, SeqState.FINISHED)
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
        self.kv.ledger.enqueue(seq, -1)
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
            self.kv.ledger.enqueue(seq, -1)
        return seq

    def running_seq(self, request_id: str) -> Sequence | None:
        return self._running.get(request_id)

    def check(self) -> None:
        """Assert every invariant against a full recount (tests only; O(pool + live))."""
        self.kv.check()
        self.decoding.check()
        assert self.kv_tokens_total == sum(q.kv_tokens for q in self.kv.holders())

    # ----- internals ---------------------------------------------------------------------

    def _new_sequence(self, req: SeqRequest) -> Sequence:
        cfg = self.config
        max_new = req.max_new_tokens or cfg.max_new_tokens_default
        keys = []
        if req.prefix is not None and req.prefix.length >= cfg.block_tokens:
            keys = self.kv.prefix_keys(req.tenant, req.prefix, req.prompt_tokens)
        now = self.clock()
        deadline_ms = req.deadline_ms if req.deadline_ms is not None else cfg.queue_deadline_ms
        self._arrivals += 1
        need = self.kv.need_blocks(len(req.prompt_tokens), max_new)
        reserve = self.policy.reserve_full
        return Sequence(
            req, self._arrivals, max_new, need, keys, reserve, now, now + deadline_ms / 1000
        )

    def _enqueue(self, seq: Sequence) -> None:
        self.queue.push(seq)
        self.kv.ledger.enqueue(seq, 1)

    def _dequeue_by_id(self, request_id: str) -> Sequence:
        seq = self.queue.get(request_id)
        assert seq is not None
        self.queue.remove(seq)
        self.kv.ledger.enqueue(seq, -1)
        return seq

    def _detach(self, seq: Sequence) -> None:
        rid = seq.request_id
        del self._running[rid]
        self.prefilling[seq.priority].pop(rid, None)
        self.decoding.discard(rid)
        self.starved.pop(rid, None)

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
                pool_used_blocks=self.kv.used_blocks,
                pool_total_blocks=self.kv.num_blocks,
            )
        )
