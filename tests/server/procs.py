"""Starting and stopping reference-server processes in tests (always stopped by PID)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
TEST_TENANTS = Path(__file__).with_name("tenants.test.yaml")
READY_TIMEOUT_S = 60.0  # a server is ready in a second or two; a busy machine takes longer


@dataclass
class Proc:
    """A started server process, its ready-file contents and its captured output."""

    popen: subprocess.Popen[bytes]
    ready: dict[str, Any]
    log: Path

    @property
    def url(self) -> str:
        return str(self.ready.get("gateway_url") or self.ready["url"])

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def start(module: str, args: Sequence[str], workdir: Path) -> Proc:
    """Run `python -m module args --ready-file ...` and wait until it is ready."""
    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / "ready.json"
    log = workdir / "output.log"
    argv = [sys.executable, "-m", module, *args, "--port", "0", "--ready-file", str(ready)]
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    proc = Proc(popen, {}, log)
    try:
        wait_until(
            lambda: ready.exists() or popen.poll() is not None,
            timeout_s=READY_TIMEOUT_S,
            what=f"{module}'s ready file",
        )
    except AssertionError as exc:
        proc.stop()
        raise RuntimeError(f"{module} not ready in {READY_TIMEOUT_S} s:\n{proc.output()}") from exc
    if not ready.exists():
        raise RuntimeError(f"{module} exited with {popen.returncode}:\n{proc.output()}")
    proc.ready = json.loads(ready.read_text())
    return proc


def start_deployment(workdir: Path, *extra: str, replicas: int = 2) -> Proc:
    args = ["--replicas", str(replicas), "--state-dir", str(workdir / "state"), *extra]
    return start("server.serve", args, workdir)


def start_replica(workdir: Path, *extra: str) -> Proc:
    return start("server.replica", ["--state-dir", str(workdir / "state"), *extra], workdir)


def events(url: str) -> list[dict[str, Any]]:
    """Every event the server has, following the cursor to the end."""
    rows: list[dict[str, Any]] = []
    cursor = ""
    for _ in range(1000):
        resp = requests.get(
            f"{url}/debug/events",
            params={"after": cursor} if cursor else None,
            headers=key("admin"),
            timeout=10,
        )
        resp.raise_for_status()
        lines = [json.loads(line) for line in resp.text.splitlines() if line]
        if not lines:
            return rows
        rows += lines
        cursor = resp.headers["X-Next-Cursor"]
    raise AssertionError("event cursor never reached the end")


def key(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer kvg-{name}-key"}
