"""`kvgate gate` on bad input: exit 2 and a message naming the problem, never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gates.cli import main
from tests.cli_helpers import kvgate
from tests.gates.builder import RunBuilder


def _run(tmp_path: Path) -> Path:
    return RunBuilder().request("a", ttft_s=0.2).write(tmp_path / "run")


def test_a_missing_run_directory_exits_2_without_a_traceback(tmp_path: Path) -> None:
    done = kvgate("gate", tmp_path / "nope")
    assert done.returncode == 2
    assert "does not exist" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: (p / "requests.jsonl").write_text('{"ttft_s": "fast"}\n{}\n'), "'ttft_s'"),
        (lambda p: (p / "requests.jsonl").write_text('{"chunks": [1]}\n'), "'chunks'"),
        (lambda p: (p / "meta.json").write_bytes(b'{"t_end": "\xff"}'), "not UTF-8"),
        (lambda p: (p / "meta.json").write_text('{"t_end": "late"}'), "t_end"),
    ],
)
def test_a_run_directory_it_cannot_trust_exits_2_naming_the_problem(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[Path], object],
    expected: str,
) -> None:
    path = _run(tmp_path)
    damage(path)
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvgate gate: ") and expected in err
    assert not (path / "verdict.json").exists()  # nothing was judged


def test_a_run_directory_that_is_a_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "run").write_text("not a directory")
    assert main([str(tmp_path / "run")]) == 2
    assert "is a file, not a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("blocked", ["verdict.json", "junit.xml"])
def test_an_output_it_cannot_write_exits_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], blocked: str
) -> None:
    path = _run(tmp_path)
    (path / blocked).mkdir()  # in the way of the file, for root as for anyone else
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert f"could not write {path / blocked}: Is a directory" in err
    assert "make its directory writable" in err


def test_a_bad_gate_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gates = tmp_path / "gates.yaml"
    gates.write_text("version: 1\ngates: [")
    assert main([str(_run(tmp_path)), "--gates", str(gates)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
