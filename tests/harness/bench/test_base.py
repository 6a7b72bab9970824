"""What every benchmark's command line shares: exit codes, --json, the table, and starting
the processes it measures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from harness.bench.base import (
    Bench,
    BenchError,
    BenchUsageError,
    run,
    start_process,
    stop_process,
)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=2)


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.n < 1:
        raise BenchUsageError("--n must be at least 1")
    if args.n > 9:
        raise BenchError("the toy cannot count that far")
    return {"n": args.n, "squares": [i * i for i in range(args.n)]}


TOY = Bench("kvgate bench toy", "A toy benchmark.", _options, _measure)


def test_json_prints_the_result_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(TOY, ["--json", "--n", "3"]) == 0
    assert json.loads(capsys.readouterr().out) == {"n": 3, "squares": [0, 1, 4]}


def test_without_json_each_key_is_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(TOY, ["--n", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n: 2", "squares: [0, 1]"]


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["--n", "0"], 2, "kvgate bench toy: error: --n must be at least 1"),
        (["--n", "many"], 2, "kvgate bench toy: error: argument --n: invalid int value"),
        (["--bogus"], 2, "kvgate bench toy: error: unrecognized arguments: --bogus"),
        (["--n", "10"], 1, "kvgate bench toy: the toy cannot count that far"),
    ],
)
def test_bad_usage_exits_2_and_a_failed_measurement_1(
    argv: list[str], code: int, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(TOY, argv) == code
    captured = capsys.readouterr()
    assert said in captured.err and captured.out == ""
    assert captured.err.startswith("usage: kvgate bench toy") == (code == 2)


def test_help_exits_0_and_describes_the_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(TOY, ["--help"]) == 0
    out = capsys.readouterr().out
    assert "A toy benchmark." in out and "--json" in out and "--n" in out


def test_start_process_returns_what_the_ready_file_says(tmp_path: Path) -> None:
    # the client benchmark's control server: it writes its ready file once it listens
    ready = tmp_path / "ready.json"
    proc, info = start_process("harness.bench.client_control", [], ready, tmp_path / "c.log")
    try:
        assert info["url"].startswith("http://127.0.0.1:") and proc.poll() is None
    finally:
        stop_process(proc)
    assert proc.poll() is not None


def test_a_process_that_exits_before_ready_is_a_bench_error_with_its_output(
    tmp_path: Path,
) -> None:
    with pytest.raises(BenchError, match="did not start") as caught:
        start_process("harness.bench.no_such_module", [], tmp_path / "r.json", tmp_path / "l")
    assert "No module named harness.bench.no_such_module" in str(caught.value)
