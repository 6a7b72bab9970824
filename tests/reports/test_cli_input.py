"""`kvgate report` and `kvgate compare` on bad input: exit 2 and a message, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from reports.cli import main as report
from reports.compare_cmd import main as compare
from tests.cli_helpers import kvgate
from tests.gates.builder import RunBuilder


@pytest.mark.parametrize("command", [("report",), ("compare", "{missing}", "{missing}")])
def test_a_missing_run_directory_exits_2_without_a_traceback(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    args = [a.format(missing=tmp_path / "nope") for a in command]
    if len(args) == 1:
        args.append(str(tmp_path / "nope"))
    done = kvgate(*args)
    assert done.returncode == 2
    assert "does not exist" in done.stderr and "Traceback" not in done.stderr


def test_report_into_an_output_it_cannot_write_exits_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = RunBuilder().request("a", ttft_s=0.2).write(tmp_path / "run")
    (path / "report.html").mkdir()  # in the way of the file, for root as for anyone else
    assert report([str(path)]) == 2
    err = capsys.readouterr().err
    assert f"kvgate report: could not write {path / 'report.html'}: Is a directory" in err


def test_report_on_a_table_of_the_wrong_type_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = RunBuilder().request("a", e2e_s=True).write(tmp_path / "run")
    assert report([str(path)]) == 2
    err = capsys.readouterr().err
    assert "column 'e2e_s' expects a number, found the boolean true" in err
    assert not (path / "report.html").exists()


def test_compare_into_an_output_it_cannot_write_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [RunBuilder().request("a", ttft_s=0.2).write(tmp_path / n) for n in ("cand", "base")]
    blocked = tmp_path / "out"
    blocked.write_text("a file where the output directory should go")
    assert compare([*map(str, runs), "--out", str(blocked)]) == 2
    assert f"kvgate compare: could not write {blocked}" in capsys.readouterr().err


def test_compare_on_a_damaged_baseline_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cand = RunBuilder().request("a", ttft_s=0.2).write(tmp_path / "cand")
    base = RunBuilder().request("a", ttft_s=0.2).write(tmp_path / "base")
    (base / "meta.json").write_text('{"windows": {"stress": [1, "later"]}}')
    assert compare([str(cand), str(base)]) == 2
    assert "windows.stress[1]" in capsys.readouterr().err
