"""`kvgate export` on good and bad input: what it writes and says, and exit 2 with a message
naming the problem, never a traceback."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from contract.trace import read_trace
from gates import schema
from reports.export.cli import main
from tests.cli_helpers import kvgate
from tests.gates.builder import RunBuilder


def small_run(path: Path) -> Path:
    b = RunBuilder()
    b.request("a", t=20.0, max_tokens=8, prompt_blocks="x")
    b.request("b", t=21.0, max_tokens=8, prompt_blocks="x")
    b.request("p", t=22.0, max_tokens=8, probe="escalation")
    return b.write(path)


def test_both_formats_are_written_into_the_run_directory_by_default(tmp_path: Path) -> None:
    path = small_run(tmp_path / "run")
    done = kvgate("export", path, "--format", "mooncake")
    assert done.returncode == 0, done.stderr
    assert f"wrote {path / schema.MOONCAKE_TRACE} (Mooncake JSONL): 2 of the run's 3" in done.stdout
    assert "left out 1 security probes" in done.stdout
    assert [r.hash_ids for r in read_trace(path / schema.MOONCAKE_TRACE).requests] == [(0,), (0,)]
    done = kvgate("export", path, "--format", "llmd")
    assert done.returncode == 0, done.stderr
    assert (path / schema.LLMD_REPORT).read_text().startswith("results:")
    assert "3 requests, 0 refused or failed, 0 cancelled" in done.stdout
    assert not list(path.glob(".*.part"))


def test_a_run_without_blocks_says_its_ids_are_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = RunBuilder().request("a", max_tokens=8).write(tmp_path / "run")
    assert main([str(path), "--format", "mooncake", "--out", str(tmp_path / "t.jsonl")]) == 0
    assert "1 requests recorded no prompt blocks" in capsys.readouterr().out


def empty_dir(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


BAD_RUNS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "missing": (lambda p: p / "nope", "run directory .*nope does not exist"),
    "a file": (lambda p: RunBuilder().write(p / "run") / schema.META_FILE, "is a file, not a run"),
    "no meta.json": (empty_dir, "meta.json is missing"),
    "no requests": (lambda p: RunBuilder().write(p / "run"), "nothing written: .* has no requests"),
    "a wrong type": (
        lambda p: RunBuilder().request("a", e2e_s="slow").write(p / "run"),
        "column 'e2e_s' expects a number",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_RUNS))
@pytest.mark.parametrize("fmt", ["mooncake", "llmd"])
def test_bad_runs_exit_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, fmt: str
) -> None:
    make, message = BAD_RUNS[case]
    assert main([str(make(tmp_path)), "--format", fmt, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvgate export: ") and re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_a_run_of_probes_alone_has_no_trace_but_has_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = RunBuilder().request("a", probe="escalation").write(tmp_path / "run")
    assert main([str(path), "--format", "mooncake"]) == 2
    err = capsys.readouterr().err
    assert "none of its 1 requests can go into a trace: 1 security probes" in err
    assert main([str(path), "--format", "llmd"]) == 0


def test_an_unknown_format_is_a_usage_error(tmp_path: Path) -> None:
    done = kvgate("export", small_run(tmp_path / "run"), "--format", "csv")
    assert done.returncode == 2
    assert "invalid choice: 'csv' (choose from 'llmd', 'mooncake')" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("fmt", ["mooncake", "llmd"])
def test_outputs_it_cannot_write_exit_2_and_leave_nothing_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    path = small_run(tmp_path / "run")
    assert main([str(path), "--format", fmt, "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path} is a directory" in capsys.readouterr().err
    missing = tmp_path / "no" / "t.out"
    assert main([str(path), "--format", fmt, "--out", str(missing)]) == 2
    assert f"its directory {missing.parent} does not exist" in capsys.readouterr().err
    out = tmp_path / "t.out"
    (tmp_path / ".t.out.part").mkdir()  # in the way of the file, for root as for anyone else
    assert main([str(path), "--format", fmt, "--out", str(out)]) == 2
    assert f"kvgate export: could not write {out}: Is a directory" in capsys.readouterr().err
    assert not out.exists()
