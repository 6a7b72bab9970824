"""Blocking client of `harness.netproxy`: start and stop the proxy process, add and remove toxics.

Plain urllib and subprocess, so it is safe in gevent greenlets (the Locust process
monkey-patches sockets and subprocess). A `network` fault adds a toxic at its start and
removes it in its rollback:

    proxy = start_proxy("127.0.0.1:8000")          # point the load at proxy.listen_url
    client = ProxyClient(proxy.control_url)
    client.add_toxic("slow", "latency", {"latency": 200})
    ...
    client.remove_toxic("slow", missing_ok=True)
    proxy.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from harness.netproxy.proxy import ProxyStats
from harness.netproxy.toxics import ToxicSpec

REPO = Path(__file__).resolve().parents[2]
READY_POLL_S = 0.02
STOP_GRACE_S = 5.0


class ProxyError(RuntimeError):
    """The proxy refused a request or could not be reached; `status` is 0 when unreachable."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class ProxyClient:
    """The control API of one running proxy (`GET/POST /toxics`, `DELETE /toxics/NAME`, ...)."""

    def __init__(self, control_url: str, timeout_s: float = 5.0) -> None:
        self.control_url = control_url.rstrip("/")
        self.timeout_s = timeout_s

    def add_toxic(
        self,
        name: str,
        type: str,
        attributes: Mapping[str, float],
        stream: str = "downstream",
        toxicity: float = 1.0,
    ) -> ToxicSpec:
        """Adds a toxic; it applies to open and new connections until it is removed."""
        body = {
            "name": name,
            "type": type,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": dict(attributes),
        }
        return ToxicSpec.from_json(self._call("POST", "/toxics", body))

    def remove_toxic(self, name: str, missing_ok: bool = False) -> None:
        """Removes a toxic; an unknown name raises ProxyError (status 404) unless missing_ok."""
        try:
            self._call("DELETE", f"/toxics/{name}")
        except ProxyError as err:
            if not (missing_ok and err.status == 404):
                raise

    def toxics(self) -> list[ToxicSpec]:
        return [ToxicSpec.from_json(item) for item in self._call("GET", "/toxics")]

    def stats(self) -> ProxyStats:
        return ProxyStats(**self._call("GET", "/stats"))

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.control_url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raise ProxyError(
                f"netproxy {method} {path}: {err.code} {_error_text(err)}", err.code
            ) from None
        except OSError as err:
            raise ProxyError(f"netproxy at {self.control_url} unreachable: {err}") from err
        return json.loads(raw) if raw else None


def _error_text(err: urllib.error.HTTPError) -> str:
    raw = err.read() if err.fp else b""
    try:
        return str(json.loads(raw)["error"])
    except (ValueError, KeyError, TypeError):
        return raw.decode(errors="replace")[:500]


class ProxyProcess:
    """A running `python -m harness.netproxy` child.

    Invariant: after `stop()` returns the process has exited and been reaped, and its
    temporary directory (ready file, and its log unless `log_path` was given) is gone.
    """

    def __init__(self, proc: subprocess.Popen[bytes], ready: Mapping[str, Any], tmp: Path) -> None:
        self.proc = proc
        self.pid = int(ready["pid"])
        self.listen = str(ready["listen"])  # HOST:PORT
        self.listen_url = f"http://{self.listen}"
        self.control_url = str(ready["control"])
        self.tmp_dir = tmp  # holds the ready file (and the log unless log_path was given)

    @property
    def client(self) -> ProxyClient:
        return ProxyClient(self.control_url)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, then SIGKILL after `grace_s`; always reaps the process."""
        try:
            if self.proc.poll() is None:  # not reaped, so the PID is still this process's
                os.kill(self.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    os.kill(self.pid, signal.SIGKILL)
                    self.proc.wait()
        finally:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_proxy(
    upstream: str,
    listen: str = "127.0.0.1:0",
    ready_timeout_s: float = 60,  # a busy machine takes its time importing aiohttp
    log_path: Path | None = None,
) -> ProxyProcess:
    """Starts a proxy to `upstream` (HOST:PORT) and returns once it listens.

    Its stderr goes to `log_path` if given (kept), else to a temporary file removed by stop().
    Raises ProxyError, with the log's tail, if it exits or is not ready in time.
    """
    tmp = Path(tempfile.mkdtemp(prefix="kvgate-netproxy-"))
    ready_file = tmp / "ready.json"
    log_file = log_path or tmp / "netproxy.log"
    cmd = [sys.executable, "-m", "harness.netproxy", "--upstream", upstream, "--listen", listen]
    cmd += ["--ready-file", str(ready_file)]
    pythonpath = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    with log_file.open("ab") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=REPO, env=env
        )
    try:
        ready = _wait_ready(proc, ready_file, log_file, ready_timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ProxyProcess(proc, ready, tmp)


def _wait_ready(
    proc: subprocess.Popen[bytes], ready_file: Path, log_file: Path, timeout_s: float
) -> dict[str, Any]:
    # The proxy writes the file atomically (rename), so it is whole once it exists.
    deadline = time.monotonic() + timeout_s
    while not ready_file.exists():
        if proc.poll() is not None:
            raise ProxyError(
                f"netproxy exited with code {proc.returncode} before it was ready: "
                f"{_tail(log_file)}"
            )
        if time.monotonic() > deadline:
            raise ProxyError(f"netproxy was not ready within {timeout_s}s: {_tail(log_file)}")
        time.sleep(READY_POLL_S)
    ready: dict[str, Any] = json.loads(ready_file.read_text())
    return ready


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip() or "(empty log)"
    except OSError:
        return "(no log)"
