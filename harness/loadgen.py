"""The load generator: Locust through its library API, as a local runner or a master + workers.

`LoadGenerator` owns the Locust Environment, its runner and (with `--processes N`) the
local worker processes. Every record, local or relayed from a worker, reaches the sink
through `environment.events.kvgate_record`, so the load shape and the sink see the same
stream in both modes. All waits are bounded by the plan's duration plus fixed slack.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
from locust import LoadTestShape, User
from locust.env import Environment
from locust.runners import STATE_STOPPED, MasterRunner, Runner

from contract import RequestRecord
from harness.distributed import (
    WORKER_CONNECT_TIMEOUT_S,
    LocalWorkers,
    MasterCollector,
    wait_for_workers,
)
from harness.looplag import LoopLag
from harness.plan import Plan
from harness.replay import CLASS_NAME as REPLAY_CLASS
from harness.replay import start_replay
from harness.sink import RecordSink, record_row
from workloads.records import install_record_hook

log = logging.getLogger(__name__)
WAIT_TICK_S = 0.25


@dataclass(slots=True)
class Distribution:
    """How the load generator is laid out: local, or a master with local/remote workers."""

    processes: int = 0  # local worker processes to start (0: local runner, unless remote)
    master_bind: str | None = None  # HOST:PORT for remote workers
    expect_workers: int = 0  # workers to wait for (local processes + remote)
    plan_file: Path | None = None  # the resolved plan local workers read
    log_dir: Path | None = None

    @property
    def distributed(self) -> bool:
        return self.processes > 0 or self.master_bind is not None


@dataclass(slots=True)
class CpuWatch:
    """Locust's cpu_warning events from this process and from workers."""

    warnings: list[dict[str, Any]] = field(default_factory=list)

    def on_warning(self, environment: Environment, cpu_usage: float, **_: Any) -> None:
        self.warnings.append({"t": time.time(), "worker": "master", "cpu_percent": cpu_usage})


class LoadGenerator:
    """Owns the Locust environment and runner. Invariant: after `close()` no user runs."""

    def __init__(
        self,
        plan: Plan,
        user_classes: list[type[User]],
        shape: LoadTestShape | None,
        host: str,
        sink: RecordSink,
        layout: Distribution,
    ) -> None:
        self.plan = plan
        self.sink = sink
        self.layout = layout
        self.cpu = CpuWatch()
        # This process's event loop, or, distributed, every worker's (harness/looplag.py)
        self.loop_lag = LoopLag()
        self.env = Environment(
            user_classes=user_classes,
            shape_class=shape,
            host=host,
            stop_timeout=plan.traffic.stop_timeout_s,
        )
        self.hook = install_record_hook(self.env)
        self.hook.add_listener(lambda record, **_: self.sink.add(record_row(record)))
        self.env.events.cpu_warning.add_listener(self.cpu.on_warning)
        self.workers: LocalWorkers | None = None
        self.collector: MasterCollector | None = None
        self.runner: Runner = self._create_runner()
        self.stopped_early: str | None = None  # why the load was stopped early, if it was
        self.shape_ended = False  # the shape ended the load itself, before the deadline

    def _create_runner(self) -> Runner:
        if not self.layout.distributed:
            return self.env.create_local_runner()
        bind_host, bind_port = "127.0.0.1", 0
        if self.layout.master_bind:
            bind_host, _, port = self.layout.master_bind.rpartition(":")
            bind_port = int(port)
        runner = self.env.create_master_runner(bind_host or "*", bind_port)
        # relayed rows fire the same hook as local ones (the shape listens there too)
        self.collector = MasterCollector(self._relay, self.cpu.warnings, self.loop_lag)
        self.collector.install(self.env)
        return runner

    def _relay(self, row: dict[str, Any]) -> None:
        self.hook.fire(record=RequestRecord(**row))

    def connect_workers(self) -> None:
        if not self.layout.distributed:
            return
        runner = self.runner
        assert isinstance(runner, MasterRunner)
        if self.layout.processes:
            assert self.layout.plan_file is not None and self.layout.log_dir is not None
            port = runner.server.port
            self.workers = LocalWorkers(
                self.layout.processes, port, self.layout.plan_file, self.layout.log_dir
            )
            self.workers.start()
        expected = max(self.layout.expect_workers, self.layout.processes)
        wait_for_workers(runner, expected, WORKER_CONNECT_TIMEOUT_S)

    @property
    def users(self) -> int:
        return int(self.runner.user_count)

    def run_load(
        self, duration_s: float, watch: Callable[[float], str | None] | None = None
    ) -> None:
        """Start users (shape or constant), hold for `duration_s`, stop them gracefully.

        The load stops early when the target fails nearly everything (`_hopeless`) or when
        `watch`, polled with the seconds elapsed, gives a reason (a gate with abort_on_fail
        failed); `stopped_early` keeps the reason."""
        load = self.plan.load
        replays = self._replay_users()
        if self.env.shape_class is not None:
            self.runner.start_shape()
        else:
            users = load.users + replays if self.plan.traffic.classes else replays
            self.runner.start(users, spawn_rate=max(load.spawn_rate, replays))
        if replays:
            start_replay(self.env)
        if not self.layout.distributed:  # workers keep their own (harness/distributed.py)
            self.loop_lag.start()
        started = time.monotonic()
        deadline = started + duration_s
        while time.monotonic() < deadline:
            gevent.sleep(WAIT_TICK_S)
            if self.env.shape_class is not None and self.runner.state == STATE_STOPPED:
                self.shape_ended = True
                break
            if self.workers is not None and self.workers.alive() == 0:
                raise RuntimeError("every local Locust worker process exited; see worker*.log")
            elapsed = time.monotonic() - started
            self.stopped_early = self._hopeless(elapsed) or (watch(elapsed) if watch else None)
            if self.stopped_early:
                log.warning("stopping the load early: %s", self.stopped_early)
                break
        self.loop_lag.stop()
        self.stop_users()

    def _replay_users(self) -> int:
        """The replay's users: one per load-generator process (each sends its share of the
        trace), none without a trace."""
        replay = next((c for c in self.env.user_classes if c.__name__ == REPLAY_CLASS), None)
        if replay is None:
            return 0
        processes = 1
        if isinstance(self.runner, MasterRunner):
            processes = max(len(self.runner.clients), 1)
        replay.fixed_count = processes
        return processes

    def _hopeless(self, elapsed_s: float) -> str | None:
        """Why the load should stop now: the target failed nearly every request in the first
        seconds (nothing listening, a wrong model, every key refused). The run is still
        judged and reported, and fails on availability; more load would only repeat it."""
        early = self.plan.load.stop_if_failing
        judged, failed = self.sink.judged, self.sink.failed
        if early is None or elapsed_s > early.within_s or judged < early.min_requests:
            return None
        if failed < early.share * judged:
            return None
        return (
            f"{failed} of the first {judged} requests failed within {elapsed_s:.0f} s "
            f"(load.stop_if_failing: share {early.share:g} of at least {early.min_requests} "
            f"in the first {early.within_s:g} s)"
        )

    def stop_users(self) -> None:
        """Stop users (in-flight requests get stop_timeout to end) and collect their records.

        The shape's last phase ends here, when the load stops: the seconds its users spend
        stopping are not part of that phase (a peak's queue drains into a stopped load)."""
        finish = getattr(self.env.shape_class, "finish", None)
        if callable(finish):
            finish()
        self.runner.stop()
        if self.collector is not None:
            workers = len(self.collector.received) or self.layout.expect_workers
            expected = max(workers, self.layout.processes)
            if not self.collector.wait_done(expected):
                log.warning("not every worker reported its last records; see meta.records")

    def cpu_warning(self) -> bool:
        runner: Any = self.runner
        return bool(
            self.cpu.warnings
            or runner.cpu_warning_emitted
            or getattr(runner, "worker_cpu_warning_emitted", False)
        )

    def close(self) -> None:
        try:
            if self.runner.state != STATE_STOPPED:
                self.runner.stop()
            self.runner.quit()
        finally:
            if self.workers is not None:
                self.workers.stop()
