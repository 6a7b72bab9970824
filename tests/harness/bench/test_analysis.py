"""`kvgate bench analysis --json` at a small size: it measures a child process and reports."""

from __future__ import annotations

import json

import pytest

from harness.bench.analysis import main


def test_bench_reports_seconds_and_peak_rss(capsys: pytest.CaptureFixture[str]) -> None:
    # 5000 synthetic requests: enough for every gate's confidence rules to pass clean data
    assert main(["--json", "--requests", "5000", "--samples", "3000"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["requests"] == 5000 and result["server_events"] > 5000
    assert result["seconds"] > 0 and 0 < result["peak_rss_gib"] < 4
    assert result["verdict"] == "PASS"
    assert 0 < result["html_bytes"] < 5_000_000
    assert set(result["targets"]) == {"seconds", "peak_rss_gib", "html_bytes"}


def test_an_analysis_past_its_time_limit_is_a_message_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A limit no analysis meets: the child is stopped and the bench says what to do.
    assert main(["--json", "--requests", "5000", "--samples", "3000", "--timeout-s", "0.01"]) == 1
    err = capsys.readouterr().err
    assert "did not finish within 0.01 s" in err and "--timeout-s" in err
    assert "Traceback" not in err


def test_bad_sizes_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--requests", "0"]) == 2
    assert "--requests >= 1" in capsys.readouterr().err
