"""kvgate's recorder inside vLLM 0.32: a scheduler that writes one JSON line per request
lifecycle event (queued, admitted, preempted, resumed, finished, aborted, released) to the
file named by $KVGATE_VLLM_EVENTS, the only place vLLM shows preemptions by request id and
the moment an aborted request's KV blocks go back to the pool.

Loaded with `--scheduler-cls kvgate_vllm_recorder.RecordingScheduler` (or
`RecordingAsyncScheduler` where vLLM schedules asynchronously, as on CUDA by default: a custom
class that is not an AsyncScheduler turns async scheduling off) and this folder on
PYTHONPATH; it runs in the EngineCore process, so it imports only vLLM and the standard
library. It observes and changes nothing: each override calls vLLM's method first and only
reads the state it leaves. The cost is one line per event, none per token: a step touches
only the requests it admitted, resumed, preempted or finished (and, when it preempted, reads
the running list once to rank the victims).

A line: `t` (epoch s, when the recorder saw the event: after the schedule step, the model
step's output or the abort that caused it), `seq` (per file, continued across restarts),
`event`, `vllm_id`, `priority` (the int vLLM schedules by), `arrival` (epoch s),
`prompt_tokens`, `output_tokens`, `num_preemptions`, `blocks` (held after the event;
released: the blocks freed), `pool_used_blocks`, `pool_total_blocks` (usable blocks, the null
block left out, as vllm:kv_cache_usage_perc counts them) and `reason`: the finish reason for
finished and aborted, and for preempted `lower_priority_running` (a request of worse rank,
a higher priority int or the same int and a later arrival, was still running after the step:
the policy took the wrong victim) or `at_risk` (nothing worse was left to take). The `init`
line gives the policy, the pool's size and its block size.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# vLLM is not a dependency of kvgate: this module runs inside vLLM's own environment, so to
# mypy here its classes are unknown (Any), and subclassing them needs the ignores below.
import vllm  # type: ignore[import-not-found]
from vllm.v1.core.sched.async_scheduler import (  # type: ignore[import-not-found]
    AsyncScheduler,
)
from vllm.v1.core.sched.scheduler import Scheduler  # type: ignore[import-not-found]
from vllm.v1.request import RequestStatus  # type: ignore[import-not-found]

EVENTS_ENV = "KVGATE_VLLM_EVENTS"
AT_RISK = "at_risk"
LOWER_PRIORITY_RUNNING = "lower_priority_running"


@dataclass(slots=True)
class _Tracked:
    """A request between its `queued` and its `released` line. `blocks` is vLLM's own live
    view of the blocks it holds (KVCacheManager.get_blocks hands out the lists the manager
    appends to), so a release reads what was freed without a count kept per step; None while
    it holds none (queued, preempted)."""

    request: Any
    admitted: bool = False
    ended: bool = False
    blocks: Any = None


def _rank(request: Any) -> tuple[int, float]:
    """vLLM's victim order: the largest rank is the one a priority scheduler preempts."""
    return (request.priority, request.arrival_time)


def _count(blocks: Any) -> int:
    if blocks is None:
        return 0
    return sum(1 for group in blocks.blocks for block in group if not block.is_null)


def _lines_in(path: str) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


class RecordingScheduler(Scheduler):  # type: ignore[misc]
    """vLLM's scheduler, unchanged, plus one line per lifecycle event. Invariant: a request
    is in `_kvgate_tracked` from its queued line until its released line, and gets exactly
    one admitted line before any preempted/resumed line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        path = os.environ.get(EVENTS_ENV)
        if not path:
            raise RuntimeError(
                f"{type(self).__name__} needs {EVENTS_ENV}: the file to append its events to"
            )
        self._kvgate_seq = _lines_in(path)
        self._kvgate_out = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._kvgate_tracked: dict[str, _Tracked] = {}
        self._kvgate_unreleased: set[str] = set()  # ended, blocks not freed yet (connectors)
        pool = self.kv_cache_manager.block_pool
        self._kvgate_write(
            "init",
            None,
            reason=None,
            policy=self.policy.value,
            num_blocks=pool.num_gpu_blocks,
            block_size=self.block_size,
            scheduler=type(self).__name__,
            vllm_version=vllm.__version__,
            pid=os.getpid(),
        )

    # -- vLLM's public methods, observed -----------------------------------------------------

    def add_request(self, request: Any) -> None:
        new = request.request_id not in self.requests  # else: a streaming session's next chunk
        super().add_request(request)
        if new:
            self._kvgate_tracked[request.request_id] = _Tracked(request)
            self._kvgate_write("queued", request)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        out = super().schedule(*args, **kwargs)
        preempted = out.preempted_req_ids or ()
        if preempted:
            self._kvgate_preempted(preempted)
        for req_id in (new.req_id for new in out.scheduled_new_reqs):
            self._kvgate_scheduled(req_id)
        for req_id in out.scheduled_cached_reqs.resumed_req_ids:
            self._kvgate_scheduled(req_id)
        return out

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        outputs = super().update_from_output(*args, **kwargs)
        for req_id in self.finished_req_ids:  # finished since the last schedule(): a few
            tracked = self._kvgate_tracked.get(req_id)
            if tracked is not None and not tracked.ended:
                reason = str(tracked.request.get_finished_reason())
                self._kvgate_end(req_id, tracked, "finished", reason)
        if self._kvgate_unreleased:
            for req_id in list(self._kvgate_unreleased):
                self._kvgate_release(req_id)
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        done = super().finish_requests(request_ids, finished_status)
        aborted = finished_status == RequestStatus.FINISHED_ABORTED
        for request in done:
            tracked = self._kvgate_tracked.get(request.request_id)
            if tracked is not None and not tracked.ended:
                reason = str(RequestStatus.get_finished_reason(finished_status))
                event = "aborted" if aborted else "finished"
                self._kvgate_end(request.request_id, tracked, event, reason)
        return done

    def shutdown(self) -> None:
        super().shutdown()
        self._kvgate_out.close()

    # -- bookkeeping --------------------------------------------------------------------------

    def _kvgate_scheduled(self, req_id: str) -> None:
        tracked = self._kvgate_tracked.get(req_id)
        if tracked is None:
            return
        tracked.blocks = self.kv_cache_manager.get_blocks(req_id)
        event = "resumed" if tracked.admitted else "admitted"
        tracked.admitted = True
        self._kvgate_write(event, tracked.request, blocks=_count(tracked.blocks))

    def _kvgate_preempted(self, req_ids: Iterable[str]) -> None:
        worst = max((_rank(r) for r in self.running), default=None)
        for req_id in req_ids:
            tracked = self._kvgate_tracked.get(req_id)
            if tracked is None:
                continue
            tracked.blocks = None  # vLLM popped the lists it freed; they are not live anymore
            worse_running = worst is not None and worst > _rank(tracked.request)
            reason = LOWER_PRIORITY_RUNNING if worse_running else AT_RISK
            self._kvgate_write("preempted", tracked.request, reason=reason)

    def _kvgate_end(self, req_id: str, tracked: _Tracked, event: str, reason: str) -> None:
        tracked.ended = True
        freed = req_id not in self.requests  # vLLM forgets a request once its blocks are free
        self._kvgate_write(
            event, tracked.request, blocks=0 if freed else _count(tracked.blocks), reason=reason
        )
        if freed:
            self._kvgate_release(req_id)
        else:
            self._kvgate_unreleased.add(req_id)

    def _kvgate_release(self, req_id: str) -> None:
        if req_id in self.requests:
            return
        tracked = self._kvgate_tracked.pop(req_id)
        self._kvgate_unreleased.discard(req_id)
        self._kvgate_write("released", tracked.request, blocks=_count(tracked.blocks))

    def _kvgate_write(
        self,
        event: str,
        request: Any,
        blocks: int = 0,
        reason: str | None = None,
        **extra: Any,
    ) -> None:
        pool = self.kv_cache_manager.block_pool
        total = pool.num_gpu_blocks - 1  # the null block is never handed out
        line: dict[str, Any] = {
            "t": time.time(),
            "seq": self._kvgate_seq,
            "event": event,
            "vllm_id": None,
            "priority": None,
            "arrival": None,
            "prompt_tokens": None,
            "output_tokens": None,
            "num_preemptions": None,
            "blocks": blocks,
            "pool_used_blocks": total - pool.get_num_free_blocks(),
            "pool_total_blocks": total,
            "reason": reason,
        }
        if request is not None:
            line |= {
                "vllm_id": request.request_id,
                "priority": request.priority,
                "arrival": request.arrival_time,
                "prompt_tokens": request.num_prompt_tokens,
                "output_tokens": request.num_output_tokens,
                "num_preemptions": request.num_preemptions,
            }
        self._kvgate_seq += 1
        self._kvgate_out.write(json.dumps(line | extra, separators=(",", ":")) + "\n")


class RecordingAsyncScheduler(RecordingScheduler, AsyncScheduler):  # type: ignore[misc]
    """The same recorder over vLLM's AsyncScheduler (its MRO puts AsyncScheduler between
    the recorder and Scheduler, so every super() call reaches the async scheduler)."""
