"""`kvgate run` on bad input: exit 2 and a message before anything starts, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.run_cmd import main as run_main

PLAN = """
name: t
target: {type: reference, replicas: 1}
traffic:
  classes:
    short_qa_critical: {weight: 1}
load: {users: 1, duration_s: 1}
"""


def _plan(tmp_path: Path, text: str = PLAN) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["{tmp}/absent.yaml"], "no such plan file"),
        (["{tmp}"], "cannot be read (Is a directory)"),
        (["{plan}", "--set", "faults=["], "the value is not valid YAML"),
        (["{plan}", "--set", "target.tenants=absent.yaml"], "target.tenants: "),
        (["{plan}", "--set", "gates=absent.yaml"], "gates: "),
        (["{plan}", "--out", "{plan}/run"], "cannot create the run directory"),
    ],
)
def test_bad_plans_exit_2_before_anything_starts(
    tmp_path: Path, args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process (a traceback would fail the test), which costs a fraction of
    spawning `kvgate run`; the command itself is spawned by the tests below."""
    plan = _plan(tmp_path)
    code = run_main([a.format(tmp=tmp_path, plan=plan) for a in args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err
    assert not (tmp_path / "runs").exists()  # no run directory, so nothing was started
