"""Synthetic runs shared by the report tests (built once per session: they are read-only inputs)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from reports.synthetic import make_run


@pytest.fixture(scope="session")
def synthetic_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("report-runs")
    return {
        "clean": make_run(base / "clean", 5000, 8000),
        "oom": make_run(base / "oom", 5000, 8000, flavour="oom"),
    }


@pytest.fixture
def run_copy(synthetic_runs: dict[str, Path], tmp_path: Path) -> Callable[[str], Path]:
    """A private copy of a synthetic run a test may write into."""

    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(synthetic_runs[name], target)
        return target

    return copy
