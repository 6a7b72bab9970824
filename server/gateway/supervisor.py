"""Replica processes: start, watch, restart, stop. The gateway learns of a death from the
process itself (`wait()` returns at once on exit), not from a health poll."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contract import EventKind
from contract.host import OWN_GROUP
from server.replica.events import EventLog
from server.replica.runtime import INTERNAL_TOKEN_ENV, PARENT_PID_ENV

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0


class ReplicaStartError(RuntimeError):
    """A replica exited or stayed silent instead of becoming ready."""


@dataclass(slots=True)
class ReplicaProc:
    """One replica slot: its id and port are fixed; the process behind it may be replaced."""

    id: str
    host: str = "127.0.0.1"  # where the gateway connects (the replica's --host, if specific)
    port: int = 0
    pid: int | None = None
    state: str = "starting"  # starting | running | dead
    exit_code: int | None = None
    restarts: int = 0
    proc: asyncio.subprocess.Process | None = None
    died: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def public(self) -> dict[str, object]:
        return {
            "id": self.id,
            "pid": self.pid,
            "port": self.port,
            "url": self.url,
            "state": self.state,
            "exit_code": self.exit_code,
            "restarts": self.restarts,
        }


class Supervisor:
    """Owns the replica processes. Invariant: `state == "running"` only between a ready file
    from the current process and that process's exit."""

    def __init__(
        self,
        ids: Sequence[str],
        replica_argv: Sequence[str],
        state_dir: Path,
        env: dict[str, str],
        on_death: Callable[[ReplicaProc], None],
        host: str = "127.0.0.1",
    ) -> None:
        connect = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        self.replicas = {rid: ReplicaProc(rid, connect) for rid in ids}
        self._argv = list(replica_argv)
        self._state_dir = state_dir
        self._env = env
        self._on_death = on_death
        self._watchers: set[asyncio.Task[None]] = set()
        self._stopping = False

    def running(self) -> list[ReplicaProc]:
        return [r for r in self.replicas.values() if r.state == "running"]

    async def start_all(self) -> None:
        await asyncio.gather(*(self.start(r) for r in self.replicas.values()))

    async def start(self, rep: ReplicaProc) -> None:
        ready = self._state_dir / f"{rep.id}.ready.json"
        ready.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "server.replica", "--replica-id", rep.id]
        argv += ["--port", str(rep.port), "--ready-file", str(ready)]
        argv += ["--state-dir", str(self._state_dir), *self._argv]
        rep.state, rep.exit_code, rep.died = "starting", None, asyncio.Event()
        # Own process group: a terminal's Ctrl-C reaches serve only, which stops replicas in
        # order; kvgate's session still (contract.host.OWN_GROUP says why).
        rep.proc = await asyncio.create_subprocess_exec(
            *argv, env=self._env, process_group=OWN_GROUP
        )
        rep.pid = rep.proc.pid
        task = asyncio.get_running_loop().create_task(self._watch(rep, rep.proc))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)
        info = await self._wait_ready(rep, ready)
        rep.port = int(str(info["port"]))
        rep.state = "running"

    async def _wait_ready(self, rep: ReplicaProc, ready: Path) -> dict[str, object]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if rep.died.is_set():
                raise ReplicaStartError(
                    f"replica {rep.id} exited with code {rep.exit_code} while starting; see "
                    f"its messages above"
                )
            if ready.exists():
                info: dict[str, object] = json.loads(ready.read_text())
                if info.get("pid") == rep.pid:
                    return info
            await asyncio.sleep(0.05)
        raise ReplicaStartError(f"replica {rep.id} was not ready within {READY_TIMEOUT_S:.0f} s")

    async def _watch(self, rep: ReplicaProc, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if rep.proc is not proc:
            return
        rep.state, rep.exit_code = "dead", code
        if self._stopping:
            return  # a deliberate shutdown is not a death worth an event
        log = EventLog(rep.id, self._state_dir)
        log.append_lifecycle(EventKind.REPLICA_DIED, f"exit_code={code}")
        log.close()
        rep.died.set()
        self._on_death(rep)

    async def restart(self, rep: ReplicaProc) -> None:
        rep.restarts += 1
        await self.start(rep)

    async def stop_all(self) -> None:
        self._stopping = True
        procs = [r.proc for r in self.replicas.values() if r.proc and r.proc.returncode is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for task in list(self._watchers):
            task.cancel()


def child_env(internal_token: str) -> dict[str, str]:
    env = dict(os.environ)
    env[INTERNAL_TOKEN_ENV] = internal_token
    env[PARENT_PID_ENV] = str(os.getpid())
    return env
