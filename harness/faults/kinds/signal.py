"""The `signal` fault: a signal to one process of any deployment (and, unless `tree: false`,
to all its descendants), found by pid, pidfile or command line when the fault fires; the
rollback is CONT after a STOP, the user's restart command (and a health poll) after any
other signal. After KILL or TERM the process is gone (the gates count a death of the
fault's target); STOP freezes it; CONT, INT and HUP do neither, as far as the gates go."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Literal, get_args

import gevent
import psutil
from pydantic import Field, field_validator, model_validator

from contract import FaultEffect
from harness.faults.base import FaultContext, FaultError, FaultRecord, FaultSpec, fault_kind
from harness.faults.shell import REAP_S, run_shell
from harness.proctree import process_tree
from harness.samplers.http import request

# The signals a `signal` fault may send (without the SIG prefix), and what each does.
SignalName = Literal["KILL", "TERM", "STOP", "CONT", "INT", "HUP"]
FAULT_SIGNALS: tuple[SignalName, ...] = get_args(SignalName)
SIGNAL_EFFECTS = {"KILL": FaultEffect.KILLS, "TERM": FaultEffect.KILLS, "STOP": FaultEffect.PAUSES}
SIGNALS = {name: signal.Signals[f"SIG{name}"] for name in FAULT_SIGNALS}
HEALTH_POLL_S = 0.5
EXIT_WAIT_S = 10.0  # how long a restart waits for the signalled process to be gone


# A signal fault's restart fields: none of them means anything without a restart_command.
# They default to None and are filled in by the validator, so a dumped plan validates again.
_RESTART_KEYS = (
    "restart_command",
    "restart_after_s",
    "timeout_s",
    "wait_healthy_url",
    "healthy_timeout_s",
)


class SignalFault(FaultSpec):
    """Send a signal to one process of any deployment: by pid, pidfile or command line.

    The rollback of STOP is CONT after `duration_s`; of any other signal, the user's
    `restart_command` after `restart_after_s` (none given: no rollback)."""

    kind: Literal["signal"] = "signal"
    signal: SignalName
    pid: int | None = Field(None, gt=1)
    pidfile: str | None = Field(None, min_length=1)  # read when the fault fires
    match: str | None = Field(None, min_length=1)  # a substring of exactly one command line
    target: str | None = None  # the row's target, e.g. r0; default pid:N, pidfile:P, match:M
    # The signal goes to the process and all its descendants (snapshotted first): a server
    # is often several processes, and a KILL of the parent alone leaves the others running.
    tree: bool = True
    duration_s: float | None = Field(None, gt=0, le=3600)  # STOP only; default 2
    restart_command: str | None = Field(None, min_length=1)  # a shell command
    restart_after_s: float | None = Field(None, ge=0, le=3600)  # default 5
    timeout_s: float | None = Field(None, gt=0, le=3600)  # restart_command's; default 60
    wait_healthy_url: str | None = None  # after the restart, poll until it answers 2xx
    healthy_timeout_s: float | None = Field(None, gt=0, le=3600)  # default 120

    @field_validator("signal", mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        """`SIGTERM`, `term` and `TERM` are one signal."""
        return value.upper().removeprefix("SIG") if isinstance(value, str) else value

    @model_validator(mode="after")
    def _coherent(self) -> SignalFault:
        given = [k for k in ("pid", "pidfile", "match") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of pid, pidfile or match (the process to signal); "
                f"got {', '.join(given) or 'none'}"
            )
        restart = [k for k in _RESTART_KEYS if getattr(self, k) is not None]
        if self.signal == "STOP":
            if restart:
                raise ValueError(
                    f"{', '.join(restart)}: a STOP is rolled back by CONT after duration_s; "
                    "restarts are for the other signals"
                )
            self.duration_s = 2.0 if self.duration_s is None else self.duration_s
            return self
        if self.duration_s is not None:
            raise ValueError(
                f"duration_s applies to STOP only (CONT follows it); after {self.signal}, "
                "give restart_command and restart_after_s"
            )
        if self.restart_command is None and restart:
            raise ValueError(f"{', '.join(restart)}: need a restart_command")
        url = self.wait_healthy_url
        if url is None and self.healthy_timeout_s is not None:
            raise ValueError("healthy_timeout_s needs a wait_healthy_url")
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"wait_healthy_url must start with http:// or https://, got {url!r}")
        if self.restart_command is not None:
            self.restart_after_s = 5.0 if self.restart_after_s is None else self.restart_after_s
            self.timeout_s = 60.0 if self.timeout_s is None else self.timeout_s
        if url is not None and self.healthy_timeout_s is None:
            self.healthy_timeout_s = 120.0
        return self

    def declared_effect(self) -> FaultEffect:
        return SIGNAL_EFFECTS.get(self.signal, FaultEffect.NONE)


@fault_kind(SignalFault)
class SignalAction:
    """signal: resolve the process, send the signal; roll back with CONT or a restart."""

    def __init__(self, spec: SignalFault, context: FaultContext) -> None:
        self.spec = spec
        self.context = context
        self.signum = SIGNALS[spec.signal]
        self.target = spec.target or _default_target(spec)
        self.hold_s = (spec.duration_s if spec.signal == "STOP" else spec.restart_after_s) or 0.0
        restart_s = EXIT_WAIT_S + (spec.timeout_s or 0.0) + (spec.healthy_timeout_s or 0.0)
        self.rollback_limit_s = restart_s + REAP_S

    def apply(self, record: FaultRecord) -> None:
        own = kvgate_pids(self.context)
        pid = self._resolve(own, record)
        if pid in own:
            raise FaultError(f"pid {pid} is one of kvgate's own processes; nothing was signalled")
        record.pid = pid
        children = [p.pid for p in process_tree(pid)[1:]] if self.spec.tree else []
        try:
            os.kill(pid, self.signum)
        except ProcessLookupError:
            raise FaultError(f"no process {pid} to send {self.spec.signal} to") from None
        except PermissionError:
            raise FaultError(
                f"not permitted to signal pid {pid} (kvgate runs as another user); use a "
                "command fault (e.g. sudo kill) instead"
            ) from None
        record.begin()
        for child in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, self.signum)
        record.params["pids"] = [pid, *children]

    def rollback(self, record: FaultRecord) -> None:
        assert record.pid is not None
        if self.spec.signal == "STOP":
            try:
                os.kill(record.pid, signal.SIGCONT)
            except ProcessLookupError:
                raise FaultError(f"pid {record.pid} was gone before its CONT") from None
            for child in record.params.get("pids", [])[1:]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(child, signal.SIGCONT)
            record.rollback.append("resumed (CONT)")
            return
        if self.spec.restart_command is None:
            return
        if not _exited(record.pid, EXIT_WAIT_S):
            record.rollback.append(f"pid {record.pid} still running at the restart")
        assert self.spec.timeout_s is not None
        result = run_shell(self.spec.restart_command, self.spec.timeout_s)
        record.params.update(result.params("restart_"))
        if not result.ok:
            raise FaultError(f"restart_command {result.describe()}")
        record.rollback.append("restart_command exited 0")
        if self.spec.wait_healthy_url is not None:
            assert self.spec.healthy_timeout_s is not None
            waited = wait_healthy(self.spec.wait_healthy_url, self.spec.healthy_timeout_s)
            record.rollback.append(f"healthy {waited:.1f}s later")

    def _resolve(self, own: set[int], record: FaultRecord) -> int:
        spec = self.spec
        if spec.pid is not None:
            return spec.pid
        if spec.pidfile is not None:
            return read_pidfile(Path(spec.pidfile))
        assert spec.match is not None
        # reading every process's command line is slow: a thread, not the users' loop
        found: list[int] = gevent.get_hub().threadpool.apply(matching_pids, (spec.match, own))
        record.params["matched_pids"] = found
        if len(found) != 1:
            listed = f" (pids {', '.join(map(str, found))})" if found else ""
            raise FaultError(
                f"match {spec.match!r}: {len(found)} processes match{listed}, and it must be "
                "exactly one (kvgate's own processes are left out); nothing was signalled. "
                "Name one process (its port, its model), or give pid or pidfile"
            )
        return found[0]


def _default_target(spec: SignalFault) -> str:
    if spec.pid is not None:
        return f"pid:{spec.pid}"
    return f"pidfile:{spec.pidfile}" if spec.pidfile is not None else f"match:{spec.match}"


def _exited(pid: int, timeout_s: float) -> bool:
    """Whether the signalled process is gone (or a zombie) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False  # not ours to inspect: restart as asked
        gevent.sleep(0.05)
    return False


def kvgate_pids(context: FaultContext) -> set[int]:
    """This process, its ancestors (whose command lines may quote the plan's patterns) and
    the helpers kvgate started (samplers, workers, proxy)."""
    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.parents()), *context.own_pids()}


def matching_pids(pattern: str, exclude: set[int]) -> list[int]:
    """PIDs whose command line (arguments joined by spaces) contains `pattern`."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline")
        if proc.info["pid"] in exclude or not cmdline:
            continue  # kvgate's own, a kernel thread, a zombie, or not ours to read
        if pattern in " ".join(cmdline):
            found.append(int(proc.info["pid"]))
    return sorted(found)


def read_pidfile(path: Path) -> int:
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise FaultError(f"pidfile {path} cannot be read ({exc.strerror or exc})") from None
    if not text.isdigit() or int(text) < 2:
        raise FaultError(f"pidfile {path} holds {text[:40]!r}, not a process id")
    return int(text)


def wait_healthy(url: str, timeout_s: float) -> float:
    """Poll `url` until it answers 2xx; the seconds it took."""
    t0 = time.monotonic()
    last = "no answer"
    while time.monotonic() - t0 < timeout_s:
        try:
            status = request(url, timeout_s=3.0).status
            if 200 <= status < 300:
                return time.monotonic() - t0
            last = f"HTTP {status}"
        except (OSError, ValueError) as exc:
            last = str(exc)
        gevent.sleep(HEALTH_POLL_S)
    raise FaultError(f"{url} was not healthy (2xx) {timeout_s:g}s after the restart ({last})")
