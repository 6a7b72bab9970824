"""Fixtures: a reference replica process, started and stopped (by PID) for the tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.procs import ROOT, start_replica


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a reference replica on a free port (demo tenants, default simulated GPU)."""
    workdir: Path = tmp_path_factory.mktemp("replica")
    proc = start_replica(workdir, "--tenants", str(ROOT / "server" / "tenants.demo.yaml"))
    try:
        yield proc.url
    finally:
        proc.stop()
