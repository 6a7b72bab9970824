"""Fixtures: one shared two-replica deployment for the tests that only send requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.procs import TEST_TENANTS, Proc, start_deployment

# Fast virtual GPU so tests do not wait on simulated H100 time.
FAST = ("--time-scale", "0.02")


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    workdir: Path = tmp_path_factory.mktemp("deployment")
    proc = start_deployment(workdir, *FAST, "--tenants", str(TEST_TENANTS))
    try:
        yield proc
    finally:
        proc.stop()
