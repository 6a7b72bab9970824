"""A vLLM server that kvgate runs itself (`target.type: vllm`): start it with the plan's engine
flags, wait for its health with progress on the console, follow its whole process tree, kill
and restart it for faults, and stop every process of it at the end.

vLLM is three processes (the API server, its EngineCore, the EngineCore's worker), and a
SIGKILL of the API server alone leaves the other two running, holding the model and the KV
cache. So the server starts in a session of its own, and every signal goes to the whole
tree: the process group, plus any descendant that left it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from contract.host import OWN_GROUP
from harness.engines.vllm import VllmLaunch, launch
from harness.plan import VllmTarget
from harness.proctree import alive, process_tree
from harness.samplers.http import request

HEALTH_POLL_S = 0.5
KILL_WAIT_S = 10.0  # after a SIGKILL, how long the tree's processes may take to be gone
PROGRESS_EVERY_S = 10.0
REPLICA_ID = "vllm"  # the one "replica" a managed engine is, for the kill and pause faults


class EngineError(RuntimeError):
    """The engine could not be started, found or stopped; the message says why and where."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS has just handed out (vLLM takes no port 0 and reports none back)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(slots=True)
class EngineProcess:
    popen: subprocess.Popen[bytes]
    started: float  # monotonic
    # every process seen in its tree, kept so that a stop finds the orphans (psutil objects,
    # so a pid reused since is never signalled)
    tree: dict[int, psutil.Process]

    @property
    def pid(self) -> int:
        return self.popen.pid


class VllmDeployment:
    """The managed vLLM server of one run.

    Invariant: after `stop()` returns, no process of any engine this object started is
    alive (SIGTERM to the group, then SIGKILL to the group and to every pid ever seen in
    the tree)."""

    def __init__(self, spec: VllmTarget, run_dir: Path, say: Callable[[str], None] = print) -> None:
        self.spec = spec
        self.dir = run_dir / "server"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.say = say
        self.port = 0
        self.launch: VllmLaunch | None = None
        self.proc: EngineProcess | None = None
        self.starts = 0
        self.state = "stopped"  # running | dead | stopped

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> str:
        """Start the engine and wait until it is healthy; its base URL."""
        if self.launch is None:
            self.port = free_port() if self.spec.url.endswith(":0") else self._plan_port()
            self.launch = launch(self.spec, self.port, self.dir)
            self.spec.url = f"http://127.0.0.1:{self.port}"
        self._spawn()
        self.say(f"kvgate: starting vLLM at {self.spec.url} (log: {self.launch.log_path})")
        self._wait_healthy(self.spec.startup_timeout_s)
        return self.spec.url

    def _plan_port(self) -> int:
        port = self.spec.url.rsplit(":", 1)[-1].strip("/")
        if not port.isdigit():
            raise EngineError(f"target.url {self.spec.url!r} names no port; give one, or :0")
        return int(port)

    def _spawn(self) -> None:
        assert self.launch is not None
        env = {**os.environ, **self.launch.env}
        with self.launch.log_path.open("ab") as log:
            log.write(
                f"\n--- kvgate: start {self.starts + 1}: {' '.join(self.launch.argv)}\n".encode()
            )
            log.flush()
            popen = subprocess.Popen(
                self.launch.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                process_group=OWN_GROUP,  # signals reach the whole tree (contract.host)
            )
        self.proc = EngineProcess(popen, time.monotonic(), {})
        self._remember_tree()
        self.starts += 1
        self.launch.pidfile.write_text(f"{popen.pid}\n")

    def _wait_healthy(self, timeout_s: float) -> float:
        """Poll /health until 200, printing progress; the seconds it took."""
        assert self.proc is not None and self.launch is not None
        url = self.spec.url + (self.spec.health_path or "/health")
        t0 = time.monotonic()
        next_say = t0 + PROGRESS_EVERY_S
        while True:
            waited = time.monotonic() - t0
            if self.proc.popen.poll() is not None:
                self.state = "dead"
                raise EngineError(
                    f"vLLM exited with code {self.proc.popen.returncode} {waited:.0f} s after "
                    f"its start; see {self.launch.log_path}:\n{self.log_tail()}"
                )
            with contextlib.suppress(OSError):
                if request(url, timeout_s=2.0).status == 200:
                    self.state = "running"
                    self._remember_tree()
                    self.say(f"kvgate: vLLM healthy after {waited:.0f} s (pid {self.proc.pid})")
                    return waited
            if waited > timeout_s:
                self._kill_all()
                raise EngineError(
                    f"vLLM was not healthy within {timeout_s:g} s (target.startup_timeout_s); "
                    f"see {self.launch.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() >= next_say:
                next_say += PROGRESS_EVERY_S
                self.say(
                    f"kvgate: waiting for vLLM to be healthy ({waited:.0f} s of {timeout_s:g} s)"
                )
            self._remember_tree()
            self._sleep(HEALTH_POLL_S)

    def _sleep(self, seconds: float) -> None:
        """A sleep that lets Locust's users run when called from the load's greenlets."""
        try:
            import gevent

            gevent.sleep(seconds)
        except ImportError:  # pragma: no cover - gevent comes with locust
            time.sleep(seconds)

    def _remember_tree(self, proc: EngineProcess | None = None) -> None:
        proc = proc or self.proc
        if proc is not None:
            for child in process_tree(proc.pid):
                proc.tree.setdefault(child.pid, child)

    def stop(self) -> None:
        """SIGTERM to the engine's group, SIGKILL after `stop_timeout_s`, and every pid ever
        seen in its tree killed too."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        self.state = "stopped"
        self._remember_tree(proc)
        if proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=self.spec.stop_timeout_s)
        self._kill_all(proc)
        if proc.popen.poll() is None:
            proc.popen.wait(timeout=10)

    def _kill_all(self, proc: EngineProcess | None = None) -> None:
        proc = proc or self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for child in proc.tree.values():
            with contextlib.suppress(psutil.Error):
                child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=10)
        # the invariant is that they are gone, not that they were signalled
        psutil.wait_procs(list(proc.tree.values()), timeout=KILL_WAIT_S)

    def log_tail(self, lines: int = 20) -> str:
        if self.launch is None:
            return "(no log)"
        try:
            text = self.launch.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- what faults act on (the ReplicaAdminAPI of harness.faults.base) ------------------------

    @property
    def restart_limit_s(self) -> float:
        """A kill's whole rollback: the death noticed, the restart, health again."""
        return 10.0 + self.spec.startup_timeout_s

    def replica(self, replica_id: str) -> dict[str, Any]:
        self._check_id(replica_id)
        if self.proc is not None and self.proc.popen.poll() is not None:
            self.state = "dead"
        pid = self.proc.pid if self.proc is not None else None
        return {"id": REPLICA_ID, "pid": pid, "state": self.state, "restarts": self.starts - 1}

    def wait_dead(self, replica_id: str, timeout_s: float = 10.0) -> None:
        """Wait for the API server to exit; then kill what is left of its tree (vLLM's
        EngineCore and worker survive their parent's SIGKILL)."""
        self._check_id(replica_id)
        if self.proc is None:
            return
        deadline = time.monotonic() + timeout_s
        while self.proc.popen.poll() is None and time.monotonic() < deadline:
            self._sleep(0.05)
        orphans = alive(list(self.proc.tree.values()))
        self._kill_all()
        self.state = "dead"
        if orphans:
            self.say(f"kvgate: killed what the engine's death left running: pids {orphans}")

    def restart(self, replica_id: str) -> None:
        self._check_id(replica_id)
        if self.proc is not None and self.proc.popen.poll() is None:
            raise EngineError("the engine is still running; it must die before its restart")
        self._spawn()

    def wait_running(self, replica_id: str, timeout_s: float | None = None) -> int | None:
        self._check_id(replica_id)
        self._wait_healthy(timeout_s or self.spec.startup_timeout_s)
        return self.proc.pid if self.proc is not None else None

    def tree_pids(self) -> list[int]:
        """The engine's processes now (for a kill or pause of the whole tree)."""
        return [p.pid for p in process_tree(self.proc.pid)] if self.proc else []

    def _check_id(self, replica_id: str) -> None:
        if replica_id != REPLICA_ID:
            raise EngineError(f"a vllm target has one replica, {REPLICA_ID!r}; not {replica_id!r}")
