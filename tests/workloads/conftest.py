"""Fixtures: a reference replica process, started and stopped (by PID) for the tests."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a reference replica on a free port (demo tenants, default simulated GPU)."""
    state = tmp_path_factory.mktemp("replica")
    ready = state / "ready.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "server.replica",
            "--port",
            "0",
            "--ready-file",
            str(ready),
            "--tenants",
            str(REPO / "server" / "tenants.demo.yaml"),
            "--state-dir",
            str(state),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr and proc.poll() is not None else ""
                pytest.fail(f"the reference replica did not become ready: {err[-2000:]}")
            time.sleep(0.05)
        yield str(json.loads(ready.read_text())["url"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
