"""`kvgate bench analysis --json` at a small size: it measures a child process and reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.bench.analysis import main, targets


def test_bench_reports_seconds_and_peak_rss(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 5000 synthetic requests: enough for every gate's confidence rules to pass clean data
    kept = tmp_path / "run"
    assert main(["--json", "--requests", "5000", "--samples", "3000", "--keep", str(kept)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["requests"] == 5000 and result["server_events"] > 5000
    assert result["seconds"] > 0 and 0 < result["peak_rss_gib"] < 4
    assert result["verdict"] == "PASS" and result["generation_s_excluded"] > 0
    assert 0 < result["html_bytes"] < 5_000_000
    assert result["targets"] == targets(5000)
    # The kept run measured again, without generating it
    assert main(["--json", "--run", str(kept)]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["requests"] == 5000 and again["generation_s_excluded"] is None
    assert again["verdict"] == "PASS"


def test_targets_grow_with_the_run() -> None:
    assert targets(10_000_000) == {"seconds": 60.0, "peak_rss_gib": 8.0, "html_bytes": 5_000_000}
    assert targets(1_000_000)["seconds"] == 6.0
    assert targets(1000)["peak_rss_gib"] == 1.0  # the interpreter's own floor


def test_an_analysis_past_its_time_limit_is_a_message_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A limit no analysis meets: the child is stopped and the bench says what to do.
    assert main(["--json", "--requests", "5000", "--samples", "3000", "--timeout-s", "0.01"]) == 1
    err = capsys.readouterr().err
    assert "did not finish within 0.01 s" in err and "--timeout-s" in err
    assert "Traceback" not in err


def test_bad_sizes_are_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--requests", "0"]) == 2
    assert "--requests >= 1" in capsys.readouterr().err
    assert main(["--run", str(tmp_path)]) == 2
    assert "holds no requests.parquet" in capsys.readouterr().err
