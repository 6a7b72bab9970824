"""`kvgate bench client` end to end at a small scale: every key it reports, sane values."""

from __future__ import annotations

import json

import pytest

from workloads.bench import main

pytestmark = pytest.mark.e2e


def test_bench_client_json_reports_ttft_error_and_events_per_cpu_second(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--json", "--streams", "8", "--warmup-s", "0.5", "--measure-s", "1.5"]
    assert main([*argv, "--max-tokens", "16", "--variants", "ours,httpuser"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("ours_ttft_err_ms_p50", "ours_ttft_err_ms_p99", "httpuser_ttft_err_ms_p99"):
        assert isinstance(out[key], float) and 0 <= out[key] < 1000, (key, out[key])
    for key in ("ours_events_per_cpu_s", "httpuser_events_per_cpu_s"):
        assert out[key] > 0
    assert out["ours_not_ok"] == 0 and out["httpuser_not_ok"] == 0
    assert out["ours_vs_httpuser_events_ratio"] > 0
    # The control server stamps each chunk as it writes it: the client's own error is small.
    assert 0 <= out["control_ours_ttft_err_ms_p50"] < 50
    assert out["control_ours_events_per_cpu_s"] > 0
    assert out["detail"]["control_ours"]["requests"] > 0


def test_bench_client_rejects_unknown_variants(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--variants", "ours,nope"]) == 2
    assert "nope" in capsys.readouterr().err
