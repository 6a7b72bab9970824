"""The analysis keeps the memory it frees (gates/memory.py): set once a run is loaded, where
the C library can."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from gates import rundir
from gates.memory import keep_freed_memory
from tests.gates.builder import RunBuilder


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_settings_once_and_for_all() -> None:
    assert keep_freed_memory()
    assert keep_freed_memory()  # a second call changes nothing and says so


def test_loading_a_run_keeps_freed_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []

    def keep() -> bool:
        calls.append(True)
        return True

    monkeypatch.setattr(rundir, "keep_freed_memory", keep)
    rundir.load_run(RunBuilder().request("a").write(tmp_path / "run"))
    assert calls == [True]
