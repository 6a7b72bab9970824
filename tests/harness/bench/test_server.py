"""`kvgate bench server` runs end to end and reports its figures (speed is not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.server.procs import ROOT

pytestmark = pytest.mark.e2e


def test_bench_reports_its_figures() -> None:
    argv = [
        sys.executable,
        "-m",
        "harness.cli",
        "bench",
        "server",
        "--json",
        "--streams",
        "20",
        "--warmup",
        "1",
        "--window",
        "1",
        "--max-tokens",
        "64",
    ]
    # It runs in seconds; the timeout is for a hung bench, however busy the machine.
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=180, check=True)
    result = json.loads(out.stdout)
    assert result["streams"] == 20
    assert result["token_events_per_s"] > 0 and result["client_sse_events"] > 0
    assert result["cpu_s_per_1k_events"] > 0
    assert result["lag_ms_max"] >= result["lag_ms_p99"] >= result["lag_ms_p50"] >= 0
    assert set(result["targets"]) == {"token_events_per_s", "lag_ms_p99", "lag_ms_max"}
    # what else ran meanwhile is reported, never negative
    assert result["reader_cpu_percent"] > 0 and result["other_processes_cpu_percent"] >= 0
    assert isinstance(result["meets_targets"], bool)
