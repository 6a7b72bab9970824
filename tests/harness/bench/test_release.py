"""The release benchmark runs both scenarios end to end and reports its figures (their speed
is not asserted: that is what the benchmark is for)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.server.procs import ROOT

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(180)
def test_bench_release_reports_storm_and_kill_figures() -> None:
    argv = [sys.executable, "-m", "harness.cli", "bench", "server", "--release", "--json"]
    argv += ["--cancels", "20", "--wave", "10"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=170, check=True)
    result = json.loads(out.stdout)
    storm, kill = result["disconnect_storm"], result["replica_kill"]
    assert storm["cancels"] == storm["released"] == 20
    assert 0 <= storm["release_ms_p50"] <= storm["release_ms_p99"] <= storm["release_ms_max"]
    assert kill["requests"] == 60 and kill["ledger_settle_s"] >= 0
    assert isinstance(result["meets_targets"], bool)
