"""`kvgate bench verdicts`: bad input exits 2 before any run; each run is one progress line;
`--json` prints the summary (less the per-run records) as the last line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.bench import verdicts
from tests.harness.qualify.test_runs import record


def test_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verdicts.main([str(tmp_path / "missing.yaml")]) == 2
    assert "no such plan file" in capsys.readouterr().err
    plan = tmp_path / "p.yaml"
    plan.write_text("name: p\n")
    assert verdicts.main([str(plan), "--runs", "0"]) == 2
    assert "--runs must be at least 1" in capsys.readouterr().err


def test_runs_print_progress_write_the_summary_and_end_with_its_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text("name: p\n")
    ttfts = iter([0.5, 0.6, 0.7])

    def run_once(plan_path: str, overrides: list[str], run_dir: Path) -> dict[str, Any]:
        return {**record("PASS", next(ttfts)), "run_dir": str(run_dir)}

    monkeypatch.setattr(verdicts, "run_once", run_once)
    out = tmp_path / "out"
    assert verdicts.main([str(plan), "--runs", "3", "--out", str(out), "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [f"run {i}/3: PASS (exit 0, 200.0 s)" for i in (1, 2, 3)]
    assert lines[3] == f"wrote {out / 'verdicts.md'}"
    printed = json.loads(lines[-1])
    assert printed["runs"] == 3 and printed["verdicts"] == {"PASS": 3}
    assert "records" not in printed
    kept = json.loads((out / "verdicts.json").read_text())
    assert [Path(r["run_dir"]).name for r in kept["records"]] == ["run01", "run02", "run03"]
