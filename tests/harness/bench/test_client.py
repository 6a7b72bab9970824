"""`kvgate bench client` end to end at a small scale: it runs and reports every key.

A bench measures time; its test checks that the figures are there, not what they are."""

from __future__ import annotations

import json

import pytest

from harness.bench.client import main

pytestmark = pytest.mark.e2e


def test_bench_client_json_reports_ttft_error_and_events_per_cpu_second(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--json", "--streams", "8", "--warmup-s", "0.5", "--measure-s", "1.5"]
    assert main([*argv, "--max-tokens", "16", "--variants", "ours,httpuser"]) == 0
    out = json.loads(capsys.readouterr().out)
    for variant in ("ours", "httpuser", "control_ours"):
        p50, p99 = out[f"{variant}_ttft_err_ms_p50"], out[f"{variant}_ttft_err_ms_p99"]
        assert isinstance(p50, float) and isinstance(p99, float) and p50 <= p99, (variant, out)
        assert out[f"{variant}_events_per_cpu_s"] > 0  # content was read in the window
        assert out["detail"][variant]["requests"] > 0
    assert out["ours_not_ok"] == 0 and out["httpuser_not_ok"] == 0
    assert out["ours_vs_httpuser_events_ratio"] > 0
    assert isinstance(out["ours_ttft_p99_target_met"], bool)
    assert isinstance(out["ours_events_target_met"], bool)


def test_bench_client_rejects_unknown_variants(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--variants", "ours,nope"]) == 2
    assert "nope" in capsys.readouterr().err
