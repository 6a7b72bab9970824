"""The replica's step loop: one asyncio task that asks the scheduler for a step, charges it to
the virtual GPU, waits out the step's simulated duration, then writes every stream's token.

The loop is the only writer of token chunks (no task per stream per token). Cancels arrive
from request handlers between steps (while the loop sleeps) and release blocks at once; new
requests start only in the room a step leaves before it is due (pacer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable

from contract import EventKind
from server.engine.sim import CostModel, CudaOutOfMemory, StepWork, VirtualGpu
from server.protocol import ApiError
from server.replica.collector import StepCollector
from server.replica.events import EventLog
from server.replica.pacer import AdmissionPacer
from server.replica.streams import Stream
from server.scheduler import (
    Admission,
    Decision,
    PoolExhausted,
    Scheduler,
    SeqRequest,
    SeqState,
    StepPlan,
)

IDLE_WORK = StepWork(prefill_tokens=0, decode_seqs=0, decode_context_tokens=0, sampled_seqs=0)

IDLE_TICK_S = 0.05  # with nothing runnable, still look at the queue (deadlines) this often
LAG_WINDOW = 4096  # recent step lags kept for /debug/steps
REANCHOR_LAG_S = 1.0
SWEEP_PERIOD_S = 1.0


class StepStats:
    """Counters the bench and /metrics read: steps, token events, recent lags."""

    def __init__(self) -> None:
        self.steps = 0
        self.token_events = 0
        self.lags: deque[float] = deque(maxlen=LAG_WINDOW)
        self.lag_max = 0.0

    def snapshot(self, with_lags: bool = False) -> dict[str, object]:
        """Totals and lag percentiles over the recent window; `lags` (oldest first) if asked."""
        lags = sorted(self.lags)

        def pct(q: float) -> float:
            return lags[min(len(lags) - 1, int(q * len(lags)))] if lags else 0.0

        out: dict[str, object] = {
            "steps": self.steps,
            "token_events": self.token_events,
            "lag_p50_s": pct(0.50),
            "lag_p99_s": pct(0.99),
            "lag_max_s": self.lag_max,
        }
        if with_lags:
            out["lags"] = list(self.lags)
        return out


class StepLoop:
    """Owns the scheduler, the virtual GPU and the live streams. Invariant: a stream is in
    `streams` exactly while the scheduler may still plan work for it."""

    def __init__(
        self,
        scheduler: Scheduler,
        gpu: VirtualGpu,
        cost: CostModel,
        events: EventLog,
        time_scale: float,
        on_lag: Callable[[float], None],
        on_release: Callable[[float], None],
    ) -> None:
        self.scheduler = scheduler
        self.gpu = gpu
        self.cost = cost
        self.events = events
        self.time_scale = time_scale
        self.streams: dict[str, Stream] = {}
        self.tenant_reserved: dict[str, int] = {}  # sum of reserved_tokens of `streams`
        self.stats = StepStats()
        self._on_lag = on_lag
        self._on_release = on_release
        self._wake = asyncio.Event()
        self._t_model: float | None = None  # monotonic time the current step is due to end
        self._task: asyncio.Task[None] | None = None
        # New requests start in the room each step leaves (handlers wait for `pacer.turn()`).
        self.pacer = AdmissionPacer()
        # Set by the replica process (not by tests that build a loop in their own process):
        # then garbage is collected only while a step runs on the virtual GPU, or when idle.
        self.collector: StepCollector | None = None

    # -- called by handlers ---------------------------------------------------------------

    def submit(self, stream: Stream, req: SeqRequest) -> Admission:
        if req.request_id in self.streams:
            raise ApiError(
                400,
                "invalid_request",
                f"request id '{stream.spec.public_id}' is already in flight on this replica; "
                f"send a unique X-Request-Id",
            )
        adm = self.scheduler.submit(req)
        if adm.http_status == 200:
            stream.set_budget(adm.max_new_tokens, adm.cached_tokens)
            if adm.outcome is Decision.ADMIT:
                # Started now: the sweep reads `admitted` to tell a started stream (cut it)
                # from a queued one (refuse it). Left unset, a stream admitted at once and
                # then dropped by the scheduler was "refused" to a handler already waiting
                # for its end, and its client hung until the replica died.
                stream.admitted.set_result(None)
            self.streams[req.request_id] = stream
            tenant = req.tenant
            self.tenant_reserved[tenant] = (
                self.tenant_reserved.get(tenant, 0) + stream.reserved_tokens
            )
            self._wake.set()
        self._log_events()
        return adm

    def cancel(self, stream: Stream, reason: str = "client_disconnect") -> None:
        """The client went away: release its blocks now, not at the end of the step."""
        if self._drop(stream.spec.request_id) is None:
            return
        t0 = time.perf_counter()
        stream.abort()
        self._release_cancelled(stream.spec.request_id, reason, t0)

    def _release_cancelled(self, request_id: str, reason: str, t0: float) -> None:
        """Free a cancelled request's blocks; `t0` is when its cancel arrived (perf_counter),
        for the release-latency histogram."""
        self._release(request_id, reason)
        self._on_release(time.perf_counter() - t0)

    def _release(self, request_id: str, reason: str) -> None:
        self.scheduler.cancel(request_id, reason)
        self._log_events()

    def _drop(self, rid: str) -> Stream | None:
        stream = self.streams.pop(rid, None)
        if stream is not None:
            tenant = stream.spec.tenant
            left = self.tenant_reserved.get(tenant, 0) - stream.reserved_tokens
            if left > 0:
                self.tenant_reserved[tenant] = left
            else:
                self.tenant_reserved.pop(tenant, None)
        return stream

    def reservations(self) -> dict[str, int]:
        return {rid: s.reserved_tokens for rid, s in self.streams.items()}

    # -- the loop -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="step-loop")
        self._task.add_done_callback(self._crashed)

    @staticmethod
    def _crashed(task: asyncio.Task[None]) -> None:
        """A replica without its step loop serves nothing: die loudly rather than hang."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        traceback.print_exception(exc, file=sys.stderr)
        sys.stderr.write("kvgate replica: step loop crashed; exiting\n")
        sys.stderr.flush()
        os._exit(70)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        try:
            await self._steps()
        except PoolExhausted as exc:
            self._die_oom(exc)

    async def _steps(self) -> None:
        next_sweep = time.monotonic() + SWEEP_PERIOD_S
        while True:
            if time.monotonic() >= next_sweep:
                self._sweep()
                next_sweep = time.monotonic() + SWEEP_PERIOD_S
            plan = self.scheduler.schedule()
            self._apply_admissions(plan)
            if not plan.prefill and not plan.decode:
                self._t_model = None  # idle: the model's clock restarts with the next step
                self.scheduler.commit(plan)
                self._log_events()
                # An idle GPU holds no activations: account memory now, or the last busy
                # step's workspace would look like memory that never came back.
                stats = self.scheduler.stats()
                try:
                    self.gpu.run_step(IDLE_WORK, stats.pool_used_blocks, stats.fragmentation)
                except CudaOutOfMemory as exc:
                    self._die_oom(exc)
                self._collect(IDLE_TICK_S)
                self.pacer.open(None)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), IDLE_TICK_S)
                continue
            await self._step(plan)

    def _apply_admissions(self, plan: StepPlan) -> None:
        for rid, adm in plan.expired:
            stream = self._drop(rid)
            if stream is not None:
                code = adm.reason.value if adm.reason else "deadline_expired"
                stream.reject(ApiError(adm.http_status, code, adm.message, adm.retry_after_s))
        for rid in plan.admitted:
            stream = self.streams.get(rid)
            if stream is not None and not stream.admitted.done():
                # Its cache hit is known only now that it starts, not when it was queued.
                stream.cached_tokens = self.scheduler.cached_tokens(rid)
                stream.admitted.set_result(None)

    async def _step(self, plan: StepPlan) -> None:
        t_start = time.monotonic()
        producers = self._producers(plan)
        ctx = 0
        for rid in plan.decode:
            stream = self.streams.get(rid)
            if stream is not None:
                ctx += stream.context_tokens
        work = StepWork(
            prefill_tokens=sum(c.tokens for c in plan.prefill),
            decode_seqs=len(plan.decode),
            decode_context_tokens=ctx,
            sampled_seqs=len(producers),
        )
        stats = self.scheduler.stats()
        try:
            self.gpu.run_step(work, stats.pool_used_blocks, stats.fragmentation)
        except CudaOutOfMemory as exc:
            self._die_oom(exc)
        # The model's clock runs on from the previous step's end while the loop is busy, so
        # CPU time spent between steps (emitting, committing) shows up as lag.
        if self._t_model is None:
            self._t_model = t_start
        self._t_model += self.cost.step_seconds(work) * self.time_scale
        # While the virtual GPU runs this step: what is left of it is the collector's room,
        # then new requests'.
        self._collect(self._t_model - time.monotonic())
        self.pacer.open(self._t_model)
        delay = self._t_model - time.monotonic()
        await asyncio.sleep(delay if delay > 0 else 0)
        now = time.monotonic()
        lag = max(now - self._t_model, 0.0)
        if lag > REANCHOR_LAG_S:  # a pause (SIGSTOP, swap) is recorded once, not carried on
            self._t_model = now
        self._record_lag(lag)
        finished = self._emit(producers)
        self.scheduler.commit(plan, finished)
        t_end = time.time()
        for rid in finished:
            stream = self._drop(rid)
            if stream is not None:
                stream.finish(t_end)
        self._log_events()

    def _sweep(self) -> None:
        """Safety net: a stream the scheduler no longer holds (dropped without an expiry in
        a plan) must not hang its client. Queued ones are rejected; started ones are cut."""
        for rid, stream in list(self.streams.items()):
            state = self.scheduler.state(rid)
            if state is not None and state is not SeqState.FINISHED:
                continue
            self._drop(rid)
            if stream.admitted.done():
                stream.abort()
            else:
                stream.reject(
                    ApiError(503, "capacity", "the scheduler dropped this queued request; retry")
                )

    def _producers(self, plan: StepPlan) -> list[str]:
        """Ids that produce a token this step: decoders, and prompts whose last chunk runs."""
        out = list(plan.decode)
        for chunk in plan.prefill:
            stream = self.streams.get(chunk.request_id)
            if stream is not None and chunk.start + chunk.tokens >= stream.context_tokens:
                out.append(chunk.request_id)
        return out

    def _emit(self, producers: list[str]) -> list[str]:
        plain = b"}"
        finished = []
        streams = self.streams
        emitted = 0
        for rid in producers:
            stream = streams.get(rid)
            if stream is None or stream.closed:
                continue
            # Debug timing stamps each write, not the step: a client's TTFT error is then
            # measured against when its own chunk left, not against the step's first write.
            if stream.spec.debug_timing:
                problem = stream.emit(b',"kvgate_emit_ts":%.6f}' % time.time())
            else:
                problem = stream.emit(plain)
            emitted += 1
            if problem is not None:
                self.cancel(stream, problem)
            elif stream.emitted >= stream.target:
                finished.append(rid)
        self.stats.token_events += emitted
        return finished

    def _record_lag(self, lag: float) -> None:
        self.stats.steps += 1
        self.stats.lags.append(lag)
        if lag > self.stats.lag_max:
            self.stats.lag_max = lag
        self._on_lag(lag)

    def _collect(self, room_s: float) -> None:
        if self.collector is not None:
            self.collector.collect_in(room_s)

    def _log_events(self) -> None:
        events = self.scheduler.drain_events()
        if events:
            self.events.append_events(events)

    def _die_oom(self, exc: CudaOutOfMemory | PoolExhausted) -> None:
        """Die as a real replica does: the OOM line on stderr, non-zero exit, streams cut."""
        self.events.append_lifecycle(EventKind.OOM, "cuda_out_of_memory")
        if isinstance(exc, PoolExhausted):  # what a real engine reports for it
            exc = CudaOutOfMemory(f"torch.OutOfMemoryError: CUDA out of memory. {exc}")
        sys.stderr.write(f"{exc}\n")
        sys.stderr.flush()
        os._exit(1)
