"""The user's shell commands, as the `command` and `signal` kinds run them: each under a
timeout, its exit code and output recorded.

Each command runs in its own session, so a timeout kills everything its command line
started. The wait is a poll with gevent sleeps in between, so the Locust users keep running
(and no SIGCHLD watcher is installed that would reap other code's children).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Any

import gevent

from contract.host import OWN_GROUP

OUTPUT_TAIL_CHARS = 2000  # of stdout and stderr, kept in the faults row's params
POLL_S = 0.05
REAP_S = 5.0  # after a kill, how long to wait for the shell to be reaped


@dataclass(frozen=True, slots=True)
class ShellResult:
    exit_code: int | None  # None: still running at its timeout, and killed
    output: str  # the tail of stdout and stderr, interleaved as written
    elapsed_s: float
    timeout_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def params(self, prefix: str = "") -> dict[str, Any]:
        """What the faults row's params keep of it."""
        fields: dict[str, Any] = {"exit_code": self.exit_code, "output": self.output}
        fields["elapsed_s"] = round(self.elapsed_s, 3)
        return {prefix + key: value for key, value in fields.items()}

    def describe(self) -> str:
        if self.exit_code is None:
            return f"timed out after {self.timeout_s:g}s and was killed"
        last = self.output.strip().splitlines()[-1:] or ["no output"]
        return f"exited {self.exit_code} ({last[0][:200]})"


def run_shell(command: str, timeout_s: float) -> ShellResult:
    """Run `command` with the shell until the shell exits. At `timeout_s`, or when the
    greenlet running it is killed (the end of the run), its process group is killed.

    Output goes to a temporary file, not a pipe: a command that starts a server in the
    background (`... &`) ends when its shell does, and the server lives on."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            command,
            shell=True,  # the plan's author wrote a shell command line
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=OWN_GROUP,
        )
        try:
            exit_code = _wait(proc, timeout_s)
        finally:
            if proc.poll() is None:  # timed out, or the greenlet was killed
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                _wait(proc, REAP_S)
        return ShellResult(exit_code, _tail(out), time.monotonic() - t0, timeout_s)


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """The exit code, or None if the process still runs after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (code := proc.poll()) is None and time.monotonic() < deadline:
        gevent.sleep(POLL_S)
    return code


def _tail(out: IO[bytes]) -> str:
    size = out.seek(0, os.SEEK_END)
    out.seek(max(0, size - 4 * OUTPUT_TAIL_CHARS))
    return out.read().decode(errors="replace")[-OUTPUT_TAIL_CHARS:]
