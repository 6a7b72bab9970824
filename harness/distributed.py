"""Locust master/worker mode: records travel from workers to the master as batched custom messages.

Workers (`kvgate run PLAN --worker --master HOST:PORT`, or the local processes that
`--processes N` starts) build the same user classes as the master and relay every record
in batches (`kvgate_records`); when their users have stopped they flush and send
`kvgate_done` with the number of records they sent, so the master can prove none was lost.
CPU warnings travel the same way (`kvgate_cpu_warning`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
from locust.env import Environment
from locust.rpc import Message
from locust.runners import MasterRunner

from contract.host import OWN_GROUP
from harness.looplag import LoopLag
from harness.plan import Plan
from harness.replay import install_worker_start
from harness.sink import record_row
from harness.traffic import build_user_classes
from workloads.records import install_record_hook

log = logging.getLogger(__name__)
MSG_RECORDS = "kvgate_records"
MSG_DONE = "kvgate_done"
MSG_CPU = "kvgate_cpu_warning"
BATCH_SIZE = 200
FLUSH_INTERVAL_S = 0.5
WORKER_CONNECT_TIMEOUT_S = 60.0
DONE_TIMEOUT_S = 30.0
QUIT_AFTER_DONE_S = 1.0  # time for the last batch to leave the socket before the worker quits


class RecordRelay:
    """Worker side: batches records and sends them to the master.

    Invariant: `sent` counts records handed to the master; after `finish()` the batch is
    empty and the master has been told `sent`.
    """

    def __init__(self, environment: Environment) -> None:
        self.environment = environment
        self.batch: list[dict[str, Any]] = []
        self.sent = 0
        self.loop_lag = LoopLag()  # from the load's start until its users are told to stop
        self._flusher = gevent.spawn(self._flush_loop)

    def add(self, record: Any) -> None:
        self.batch.append(record_row(record))
        if len(self.batch) >= BATCH_SIZE:
            self.flush()

    def flush(self) -> None:
        if not self.batch or self.environment.runner is None:
            return
        batch, self.batch = self.batch, []
        self.environment.runner.send_message(MSG_RECORDS, batch)
        self.sent += len(batch)

    def _flush_loop(self) -> None:
        while True:
            gevent.sleep(FLUSH_INTERVAL_S)
            self.flush()

    def finish(self) -> None:
        self.flush()
        if self.environment.runner is not None:
            worker = getattr(self.environment.runner, "client_id", "worker")
            done = {"worker": worker, "sent": self.sent, "loop_lag": self.loop_lag.as_message()}
            self.environment.runner.send_message(MSG_DONE, done)


def install_worker_relay(environment: Environment, record_hook: Any) -> RecordRelay:
    relay = RecordRelay(environment)
    record_hook.add_listener(lambda record, **_: relay.add(record))
    environment.events.test_start.add_listener(lambda **_: relay.loop_lag.start())
    environment.events.test_stopping.add_listener(lambda **_: relay.loop_lag.stop())

    def on_stop(**_: Any) -> None:
        relay.loop_lag.stop()
        relay.finish()
        # A kvgate worker serves one run, so it leaves once its records are out. Waiting for
        # the master's quit is not enough: a master that quits while the worker is in
        # Locust's post-stop pause (stop_timeout) has no clients to tell, and the worker
        # would wait for a heartbeat timeout.
        if environment.runner is not None:
            gevent.spawn_later(QUIT_AFTER_DONE_S, environment.runner.quit)

    environment.events.test_stop.add_listener(on_stop)

    def on_cpu(environment: Environment, cpu_usage: float, **_: Any) -> None:
        if environment.runner is not None:
            data = {"t": time.time(), "cpu_percent": cpu_usage, "worker": _worker_name()}
            environment.runner.send_message(MSG_CPU, data)

    environment.events.cpu_warning.add_listener(on_cpu)
    return relay


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(slots=True)
class MasterCollector:
    """Master side: delivers relayed records and tracks what each worker says it sent."""

    deliver: Callable[[dict[str, Any]], None]
    cpu_warnings: list[dict[str, Any]]
    loop_lag: LoopLag  # every worker's, merged
    sent: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)

    def install(self, environment: Environment) -> None:
        assert environment.runner is not None
        environment.runner.register_message(MSG_RECORDS, self._on_records)
        environment.runner.register_message(MSG_DONE, self._on_done)
        environment.runner.register_message(MSG_CPU, self._on_cpu)

    def _on_records(self, environment: Environment, msg: Message, **_: Any) -> None:
        self.received[msg.node_id] = self.received.get(msg.node_id, 0) + len(msg.data)
        for row in msg.data:
            self.deliver(row)

    def _on_done(self, environment: Environment, msg: Message, **_: Any) -> None:
        self.sent[msg.node_id] = int(msg.data["sent"])
        self.loop_lag.add(msg.data.get("loop_lag") or {})

    def _on_cpu(self, environment: Environment, msg: Message, **_: Any) -> None:
        self.cpu_warnings.append(dict(msg.data))

    def wait_done(self, workers: int, timeout_s: float = DONE_TIMEOUT_S) -> bool:
        """Wait until `workers` workers said they are done; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.sent) < workers:
            gevent.sleep(0.1)
        return len(self.sent) >= workers

    def summary(self) -> dict[str, Any]:
        lost = {w: n - self.received.get(w, 0) for w, n in self.sent.items()}
        return {"sent": self.sent, "received": self.received, "lost": lost}


class LocalWorkers:
    """N worker processes on this host. Invariant: `stop()` leaves none of them running."""

    def __init__(self, count: int, master_port: int, plan_file: Path, log_dir: Path) -> None:
        self.count = count
        self.master_port = master_port
        self.plan_file = plan_file
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        repo_root = Path(__file__).resolve().parent.parent
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root), env.get("PYTHONPATH")) if p)
        for index in range(self.count):
            cmd = [sys.executable, "-m", "harness.run_cmd", str(self.plan_file), "--worker"]
            cmd += ["--master", f"127.0.0.1:{self.master_port}"]
            with (self.log_dir / f"worker{index}.log").open("ab") as out:
                proc = subprocess.Popen(
                    cmd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=repo_root,
                    env=env,
                    process_group=OWN_GROUP,
                )
            self.procs.append(proc)

    def alive(self) -> int:
        return sum(1 for p in self.procs if p.poll() is None)

    def stop(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for index, proc in enumerate(self.procs):
            if proc.poll() is None:
                log.warning("worker %d did not quit within %.0f s; terminating", index, timeout_s)
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)


def wait_for_workers(runner: MasterRunner, count: int, timeout_s: float) -> None:
    """Block until `count` workers are connected and ready, or raise with what was seen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(runner.clients.ready) >= count:
            return
        gevent.sleep(0.2)
    ready = len(runner.clients.ready)
    raise RuntimeError(
        f"only {ready} of {count} Locust workers connected within {timeout_s:.0f}s; start "
        "workers with `kvgate run PLAN --worker --master HOST:PORT` (see worker*.log)"
    )


def run_worker(plan: Plan, master: str, max_lifetime_s: float) -> int:
    """A worker process: same user classes as the master, records relayed to it."""
    host, _, port = master.rpartition(":")
    random.seed(plan.seed)
    # the master's spawn message sets the real host on every class
    environment = Environment(user_classes=build_user_classes(plan, host=""))
    hook = install_record_hook(environment)
    runner = environment.create_worker_runner(host or "127.0.0.1", int(port))
    install_worker_relay(environment, hook)
    install_worker_start(environment, runner)
    # the runner's greenlet is a Group: join says whether it emptied within the time
    if not runner.greenlet.join(timeout=max_lifetime_s):
        log.error("worker outlived the plan by far (%.0fs); quitting", max_lifetime_s)
        runner.quit()
        return 1
    return 0
