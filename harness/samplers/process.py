"""The sampler process: runs every sampler on its own interval, away from Locust's greenlets.

Started by the orchestrator as `python -m harness.samplers.process CONFIG.json`. One thread
per sampler (this process is not gevent-patched, so blocking calls are fine); it owns
`samples.jsonl` and `server_events.jsonl`. SIGTERM/SIGINT make it drain the event log one
last time and exit; it also exits when its parent dies or after `max_runtime_s`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from contract import EventKind
from gates import schema
from harness.jsonl import JsonlTail
from harness.rundir import TableWriter
from harness.samplers.events import EventCollector, LifecycleMonitor, Replica, ReplicaTable
from harness.samplers.host import HostCpuSampler, TargetFinder
from harness.samplers.nvml import NvmlSampler, load_pynvml
from harness.samplers.prometheus import Endpoint, PrometheusSampler, Row, error_row

log = logging.getLogger("kvgate.samplers")

# The role of the kvgate run process itself among the watched processes; every other role
# is the target's (its gateway, its server process, a replica).
OWN_ROLE = "harness"


@dataclass(slots=True)
class SamplerConfig:
    """Everything the sampler process needs, passed as one JSON file."""

    run_dir: str
    gateway_url: str | None  # reference target: the gateway (events, admin, metrics)
    replicas: list[dict[str, object]]  # [{"id", "url", "pid"}] from the ready file
    external_url: str | None = None  # external target: only its /metrics
    admin_key: str | None = None
    state_dir: str | None = None  # the reference server's state dir (replica event files)
    watch_pids: dict[str, int] = field(default_factory=dict)  # role -> pid (process stats)
    # role -> pidfile, read at every sample (an external server's process, across restarts);
    # a watched process that disappears is recorded once as `process_died`
    watch_pidfiles: dict[str, str] = field(default_factory=dict)
    # nvml, prometheus, events, process, host
    intervals: dict[str, float] = field(default_factory=dict)
    metric_prefixes: list[str] = field(default_factory=list)
    # a managed vLLM: the JSON-lines file its scheduler recorder writes, and the kvgate
    # priority each of its integer priorities stands for (the profile's mapping, inverted)
    engine_events: str | None = None
    engine_priorities: dict[str, str] = field(default_factory=dict)
    parent_pid: int = 0  # the kvgate run process: its tree is kvgate's own CPU (host sampler)
    max_runtime_s: float = 3600.0

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> SamplerConfig:
        return cls(**json.loads(path.read_text()))


class ProcessSampler:
    """CPU and resident memory of the target's processes and of the harness itself.

    A process that stops existing is one `process_died` row (labels: its role), once per
    PID: what the OOM gate reads for a server that shows no events of its own."""

    def __init__(self, roles: Callable[[], dict[str, int]]) -> None:
        self._roles = roles
        self._procs: dict[int, psutil.Process] = {}
        self._dead: set[int] = set()

    def sample(self) -> list[Row]:
        rows: list[Row] = []
        for role, pid in self._roles().items():
            t = time.time()
            try:
                proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
                cpu = proc.cpu_percent()  # since the last call; the first call reads 0
                rss = proc.memory_info().rss
                if proc.status() == psutil.STATUS_ZOMBIE:
                    raise psutil.NoSuchProcess(pid)
            except psutil.NoSuchProcess:
                self._procs.pop(pid, None)
                if pid not in self._dead:
                    self._dead.add(pid)
                    rows.append(_died(t, pid, role))
                continue
            except psutil.Error as exc:
                self._procs.pop(pid, None)
                rows.append(error_row(t, "process", str(pid), "process_error", str(exc)))
                continue
            labels = f"role={role}"
            for metric, value in (("process_cpu_percent", cpu), ("process_rss_bytes", rss)):
                rows.append(
                    {
                        "t": t,
                        "source": "process",
                        "target": str(pid),
                        "metric": metric,
                        "labels": labels,
                        "value": float(value),
                    }
                )
        return rows


def _died(t: float, pid: int, role: str) -> Row:
    return {
        "t": t,
        "source": "process",
        "target": str(pid),
        "metric": "process_died",
        "labels": f"role={role}",
        "value": 1.0,
    }


def _pid(value: object) -> int | None:
    """A replica's pid from the ready file: an integer, or null while it has none."""
    return value if isinstance(value, int) else None


def read_pidfile(path: str) -> int | None:
    try:
        pid = int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 1 else None


def oom_detector(state_dir: str | None) -> Callable[[str, int | None], bool]:
    """Did replica `rid` die of (simulated) CUDA OOM? A replica that runs out of memory writes
    an `oom` row to `<state-dir>/<rid>.events.jsonl` as its last act (the supervisor may add
    a `replica_died` row after it), so look for `oom` since the replica last started."""

    def is_oom(rid: str, exit_code: int | None) -> bool:
        path = Path(state_dir) / f"{rid}.events.jsonl" if state_dir else None
        if path is None or not path.exists() or exit_code == -signal.SIGKILL:
            return False
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 16384))
            lines = f.read().splitlines()
        for line in reversed(lines):
            try:
                event = json.loads(line).get("event")
            except json.JSONDecodeError:
                continue  # a torn line
            if event in (EventKind.OOM, EventKind.REPLICA_STARTED):
                return bool(event == EventKind.OOM)
        return False

    return is_oom


class RecorderEvents:
    """A managed vLLM's scheduler recorder, followed as its file grows: each line becomes a
    server_events row (harness/engines/vllm.py owns the mapping)."""

    def __init__(self, config: SamplerConfig) -> None:
        assert config.engine_events is not None
        self.tail = JsonlTail(Path(config.engine_events))
        self.priorities = {int(k): v for k, v in config.engine_priorities.items()}

    def poll(self) -> list[Row]:
        from harness.engines.vllm import event_rows

        rows: list[Row] = []
        for raw in self.tail.poll():
            rows += event_rows(raw, self.priorities)
        return rows


class SamplerProcess:
    """Owns the threads and writers. Invariant: writers close only after every thread ended."""

    def __init__(self, config: SamplerConfig) -> None:
        self.config = config
        run_dir = Path(config.run_dir)
        self.samples = TableWriter(run_dir, schema.SAMPLES)
        self.events = TableWriter(run_dir, schema.SERVER_EVENTS)
        self.stop = threading.Event()
        replicas = [
            Replica(str(r["id"]), str(r["url"]), _pid(r.get("pid"))) for r in config.replicas
        ]
        self.table = ReplicaTable(replicas)
        self.collector = (
            EventCollector(config.gateway_url, token=config.admin_key)
            if config.gateway_url
            else None
        )
        self.engine = RecorderEvents(config) if config.engine_events else None
        self.lifecycle = (
            LifecycleMonitor(
                config.gateway_url,
                config.admin_key or "",
                self.table,
                oom_detector(config.state_dir),
            )
            if config.gateway_url
            else None
        )

    def _endpoints(self) -> list[Endpoint]:
        if self.config.external_url:
            return [Endpoint("target", self.config.external_url)]
        gateway = [Endpoint("gateway", self.config.gateway_url)] if self.config.gateway_url else []
        return gateway + self.table.endpoints()

    def _roles(self) -> dict[str, int]:
        roles = dict(self.config.watch_pids)
        for role, path in self.config.watch_pidfiles.items():
            pid = read_pidfile(path)
            if pid is not None:
                roles[role] = pid
        for replica in self.table.all():
            if replica.pid is not None and replica.state == "running":
                roles[f"replica:{replica.id}"] = int(replica.pid)
        return roles

    def _loops(self) -> dict[str, tuple[float, Callable[[], None]]]:
        iv = self.config.intervals
        loops: dict[str, tuple[float, Callable[[], None]]] = {}
        if iv.get("nvml"):
            nvml = NvmlSampler(
                load_pynvml(), self.table.pids, self.table.endpoints, token=self.config.admin_key
            )
            loops["nvml"] = (iv["nvml"], lambda: self.samples.write_many(nvml.sample()))
        if iv.get("prometheus"):
            prom = PrometheusSampler(
                self._endpoints, self.config.metric_prefixes, token=self.config.admin_key
            )
            loops["prometheus"] = (iv["prometheus"], lambda: self.samples.write_many(prom.sample()))
        if iv.get("process"):
            procs = ProcessSampler(self._roles)
            loops["process"] = (iv["process"], lambda: self.samples.write_many(procs.sample()))
        if iv.get("host"):
            host = HostCpuSampler(
                self.config.parent_pid,
                TargetFinder(
                    lambda: [pid for role, pid in self._roles().items() if role != OWN_ROLE],
                    self.config.external_url or self.config.gateway_url,
                ),
            )
            loops["host"] = (iv["host"], lambda: self.samples.write_many(host.sample()))
        if iv.get("events") and ((self.lifecycle and self.collector) or self.engine):
            loops["events"] = (iv["events"], self._collect_events)
        return loops

    def _collect_events(self) -> None:
        if self.lifecycle:
            self.events.write_many(self.lifecycle.poll())
        if self.collector:
            self.events.write_many(self.collector.poll())
        if self.engine:
            self.events.write_many(self.engine.poll())

    def _run_loop(self, name: str, interval: float, tick: Callable[[], None]) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                tick()
            except Exception as exc:  # a sampler bug must not end the others; record it
                self.samples.write(
                    error_row(time.time(), "harness", name, "sampler_error", repr(exc))
                )
            self.stop.wait(max(0.0, interval - (time.monotonic() - started)))

    def _watchdog(self) -> None:
        deadline = time.monotonic() + self.config.max_runtime_s
        while not self.stop.wait(0.5):
            orphaned = self.config.parent_pid and os.getppid() != self.config.parent_pid
            if orphaned or time.monotonic() > deadline:
                self.stop.set()

    def run(self) -> None:
        threads = [
            threading.Thread(target=self._run_loop, args=(name, iv, tick), name=name, daemon=True)
            for name, (iv, tick) in self._loops().items()
        ]
        threads.append(threading.Thread(target=self._watchdog, name="watchdog", daemon=True))
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)
        try:
            self._collect_events()  # the last events: a run's end must not lose its tail
        finally:
            self.samples.close()
            self.events.close()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="kvgate-samplers: %(message)s")
    if len(argv) != 1:
        print("usage: python -m harness.samplers.process CONFIG.json", file=sys.stderr)
        return 2
    process = SamplerProcess(SamplerConfig.load(Path(argv[0])))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: process.stop.set())
    process.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
