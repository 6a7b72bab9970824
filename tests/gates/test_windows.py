"""Named time windows resolve from meta.json and the faults table, or say why they cannot."""

from __future__ import annotations

from pathlib import Path

import pytest

from gates.rundir import load_run
from gates.windows import resolve_window
from tests.gates.builder import T0, RunBuilder


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    b = RunBuilder().fault(40, t_end=46).fault(70)
    b.meta["phases"] = [
        {"name": "peak", "t0": T0 + 10, "t1": T0 + 30},
        {"name": "trough", "t0": T0 + 30, "t1": T0 + 50},
        {"name": "peak", "t0": T0 + 50, "t1": T0 + 70},
    ]
    return b.write(tmp_path / "run")


def test_meta_windows_phases_and_faults(run_dir: Path) -> None:
    run = load_run(run_dir)
    assert resolve_window(run, "stress") == [(T0 + 10, T0 + 100)]
    assert resolve_window(run, "phase:peak") == [(T0 + 10, T0 + 30), (T0 + 50, T0 + 70)]
    assert resolve_window(run, "after_fault") == [(T0 + 40, T0 + 120)]
    # an open fault (no t_end yet) lasts until the end of the run
    assert resolve_window(run, "during_fault") == [(T0 + 40, T0 + 46), (T0 + 70, T0 + 120)]


def test_absent_windows_are_reasons_not_the_whole_run(tmp_path: Path) -> None:
    b = RunBuilder()
    b.meta["windows"] = {"stress": None}
    run = load_run(b.write(tmp_path / "run"))
    assert "meta.windows.stress" in str(resolve_window(run, "stress"))
    assert "no phase named" in str(resolve_window(run, "phase:peak"))
    assert "no fault" in str(resolve_window(run, "after_fault"))
