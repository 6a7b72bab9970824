"""FaultScheduler: fires a plan's faults at their times as greenlets, and ends them."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence

import gevent
from gevent.event import Event
from greenlet import greenlet

from harness.faults.base import (
    ActionFactory,
    FaultAction,
    FaultContext,
    FaultError,
    FaultRecord,
    FaultSpec,
    ReplicaAdminAPI,
    ToxicClient,
)
from harness.faults.registry import ACTIONS
from harness.rundir import TableWriter

log = logging.getLogger(__name__)
STOP_GRACE_S = 5.0  # beyond the longest rollback, how long stop() waits for the rows


class FaultScheduler:
    """Fires the plan's faults at their times; `stop()` ends them with their rollbacks run.

    Every action is built here, so a fault whose kind cannot act on this run (a replica
    kind without the gateway, a network fault without the proxy) stops the run before its
    load starts. Invariant: every fault that fired writes exactly one row, after its rollback;
    its `effect` is the one its plan entry declares if its apply() completed, else `none`.
    """

    def __init__(
        self,
        faults: Sequence[FaultSpec],
        admin: ReplicaAdminAPI | None,
        writer: TableWriter,
        recent_cancels: Callable[[float], int],
        *,
        proxy: ToxicClient | None = None,
        own_pids: Callable[[], Collection[int]] | None = None,
        registry: Mapping[str, ActionFactory] = ACTIONS,
    ) -> None:
        context = FaultContext(recent_cancels, admin, proxy, own_pids or (lambda: ()))
        self.faults = sorted(faults, key=lambda f: f.at_s)
        self.actions = [registry[fault.kind](fault, context) for fault in self.faults]
        self.writer = writer
        self.fired = 0
        self.failed = 0
        # what each fault whose rollback did not finish left behind ("r0: restart ...")
        self.unfinished_rollbacks: list[str] = []
        self._greenlets: list[gevent.Greenlet[..., None]] = []
        # apply | hold | rollback, by the greenlet that runs the fault (gevent.getcurrent())
        self._phase: dict[greenlet, str] = {}
        self._ending = Event()  # set by stop(): holds end now, rollbacks run

    def start(self, load_start_monotonic: float) -> None:
        for fault, action in zip(self.faults, self.actions, strict=True):
            delay = max(0.0, load_start_monotonic + fault.at_s - time.monotonic())
            self._greenlets.append(gevent.spawn_later(delay, self._run, fault, action))

    def inject_now(self, kind: str) -> str:
        """Fire the plan's first fault of `kind` now, once more (the live page's control); it
        is journaled like a scheduled one, its params saying `injected: now`."""
        for fault, action in zip(self.faults, self.actions, strict=True):
            if fault.kind == kind:
                self._greenlets.append(gevent.spawn(self._run, fault, action, True))
                return f"{kind} fault injected on {action.target}"
        kinds = ", ".join(sorted({f.kind for f in self.faults})) or "none"
        raise ValueError(f"the plan has no {kind} fault to inject; its kinds: {kinds}")

    @property
    def holding(self) -> int:
        """Faults in effect now, between their apply and their rollback."""
        return sum(phase == "hold" for phase in self._phase.values())

    @property
    def kinds(self) -> list[str]:
        return sorted({f.kind for f in self.faults})

    def stop(self) -> None:
        """Cancel faults not yet fired or not yet in effect; end the holds of those in effect,
        so their rollbacks run now, and wait for every rollback (a restart under way
        included) up to the longest rollback's limit: the run must not end with the server
        still coming back. A rollback still running then is interrupted, and its row says so."""
        self._ending.set()
        for g in self._greenlets:
            if self._phase.get(g, "apply") == "apply":  # also: not yet begun
                g.kill(block=False)  # one being applied rolls back what it began
        running = [g for g in self._greenlets if g.started and not g.dead]
        limit = max((a.rollback_limit_s for a in self.actions), default=0.0) + STOP_GRACE_S
        gevent.joinall(running, timeout=limit)
        gevent.killall([g for g in running if not g.dead], block=True, timeout=STOP_GRACE_S)

    def _run(self, fault: FaultSpec, action: FaultAction, now: bool = False) -> None:
        params = {**fault.model_dump(), **({"injected": "now"} if now else {})}
        record = FaultRecord(uuid.uuid4().hex[:12], fault.kind, action.target, params)
        me = gevent.getcurrent()
        self._phase[me] = "apply"
        self.fired += 1
        try:
            try:
                action.apply(record)
            except Exception as exc:
                record.fail(_why(exc))
            except BaseException:
                record.fail("interrupted (the run ended) before it was applied in full")
                raise
            else:
                record.effect = fault.declared_effect()
                self._phase[me] = "hold"
                self._ending.wait(timeout=action.hold_s)  # the end of the load cuts it short
        finally:
            self._phase[me] = "rollback"
            try:
                # the rollback runs even if the greenlet is killed mid-hold (Ctrl-C, end of run)
                if record.t_start is not None:
                    _roll_back(action, record)
            finally:
                self._journal(record)

    def _journal(self, record: FaultRecord) -> None:
        if record.problems:
            self.failed += 1
        unfinished = [p for p in record.problems if p.startswith("rollback")]
        if unfinished:
            self.unfinished_rollbacks.append(f"{record.target}: {'; '.join(unfinished)}")
        record.t_end = time.time()
        self.writer.write(record.row())
        log.info(
            "fault %s %s on %s: %s", record.fault_id, record.kind, record.target, record.outcome
        )


def _roll_back(action: FaultAction, record: FaultRecord) -> None:
    try:
        action.rollback(record)
    except Exception as exc:
        record.fail(f"rollback: {_why(exc)}")
    except BaseException:
        record.fail("rollback interrupted")
        raise


def _why(exc: Exception) -> str:
    """A fault's own errors say what went wrong; anything else is named by its type."""
    if isinstance(exc, FaultError | OSError | ValueError):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"
