"""Fixtures: one shared two-replica deployment for the tests that only send requests, and one
shared standalone replica (the only kind that takes API keys itself)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.procs import TEST_TENANTS, Proc, start_deployment, start_replica

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


@pytest.fixture(scope="session")
def standalone_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    workdir: Path = tmp_path_factory.mktemp("standalone")
    proc = start_replica(workdir, *FAST, "--tenants", str(TEST_TENANTS))
    try:
        yield proc
    finally:
        proc.stop()
