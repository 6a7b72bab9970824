"""`kvgate export --format llmd`: the run's llm-d Benchmark Report, validated by the
llmd-benchmark-report package, carrying the run's own numbers and none of its keys."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llmd_benchmark_report import BenchmarkReportV02, import_benchmark_report

from contract.runmeta import RunMeta
from gates.rundir import load_run, read_meta
from reports.export import llmd
from reports.export.cli import main
from reports.export.columns import read_columns
from tests.gates.builder import RunBuilder


def exported(path: Path, out: Path) -> BenchmarkReportV02:
    """The run exported through the command, read back by the package."""
    assert main([str(path), "--format", "llmd", "--out", str(out)]) == 0
    report = import_benchmark_report(str(out))
    assert isinstance(report, BenchmarkReportV02)
    return report


def build(b: RunBuilder, tmp_path: Path) -> dict[str, Any]:
    path = b.write(tmp_path / "run")
    meta = RunMeta.read(read_meta(path))
    return llmd.build_report(meta, read_columns(path, llmd.COLUMNS)).dump()


@pytest.mark.parametrize("name", ["report.yaml", "report.json"])
def test_a_runs_report_validates_with_the_package_and_carries_its_numbers(
    synthetic_runs: dict[str, Path], tmp_path: Path, name: str
) -> None:
    path = synthetic_runs["clean"]
    report = exported(path, tmp_path / name).dump()
    if name.endswith(".json"):
        assert json.loads((tmp_path / name).read_text()) == report
    run = load_run(path)
    requests = run.requests
    ok = requests[requests["outcome"] == "ok"]
    aggregate = numbers(report)
    counts = aggregate["requests"]
    assert counts["total"] == len(requests)
    assert counts["incomplete"] == (requests["outcome"] == "cancelled").sum()
    assert counts["failures"] == (~requests["outcome"].isin(["ok", "cancelled"])).sum()
    ttft = aggregate["latency"]["time_to_first_token"]
    assert ttft["units"] == "s"
    assert ttft["p50"] == pytest.approx(np.percentile(ok["ttft_s"].dropna(), 50))
    assert aggregate["latency"]["request_latency"]["mean"] == pytest.approx(ok["e2e_s"].mean())
    start = datetime.fromisoformat(report["run"]["time"]["start"])
    assert start == datetime.fromtimestamp(run.meta["t_start"], tz=UTC)
    assert report["scenario"]["load"]["standardized"]["tool"] == "kvgate"


def numbers(report: dict[str, Any]) -> dict[str, Any]:
    aggregate: dict[str, Any] = report["results"]["request_performance"]["aggregate"]
    return aggregate


def test_time_per_token_gaps_and_rates_come_from_answered_requests(tmp_path: Path) -> None:
    b = RunBuilder()
    b.request(
        "a",
        t=20.0,
        ttft_s=0.2,
        e2e_s=1.2,
        chunks=11,
        completion_tokens=11,
        itl_mean_s=0.01,
        itl_max_s=0.03,
        prompt_tokens=100,
        max_tokens=11,
    )
    b.request(
        "b",
        t=30.0,
        ttft_s=0.5,
        e2e_s=2.0,
        chunks=3,
        completion_tokens=3,
        itl_mean_s=0.07,
        itl_max_s=0.09,
        prompt_tokens=300,
        max_tokens=3,
    )
    b.request("refused", t=25.0, outcome="rejected", http_status=429, max_tokens=3)
    b.request("gone", t=26.0, outcome="cancelled", ttft_s=0.1, e2e_s=40.0, max_tokens=3)
    report = numbers(build(b, tmp_path))
    latency = report["latency"]
    assert latency["time_per_output_token"]["min"] == pytest.approx(0.1)  # (1.2 - 0.2) / 10
    assert latency["time_per_output_token"]["max"] == pytest.approx(0.75)  # (2.0 - 0.5) / 2
    assert latency["inter_token_latency"] == {
        "units": "s/token",
        "mean": pytest.approx((0.01 * 10 + 0.07 * 2) / 12),  # every gap weighs alike
        "max": pytest.approx(0.09),
    }
    assert latency["time_to_first_token"]["max"] == pytest.approx(0.5)  # not the cancelled
    throughput = report["throughput"]
    span = 26.0 + 40.0 - 20.0  # from the first send to the last end (the cancelled one's)
    assert throughput["request_rate"]["mean"] == pytest.approx(2 / span)
    assert throughput["input_token_rate"]["mean"] == pytest.approx(400 / span)
    assert report["requests"]["failures"] == 1 and report["requests"]["incomplete"] == 1


def test_the_stack_says_what_served(tmp_path: Path) -> None:
    b = RunBuilder().request("a", max_tokens=4)
    b.meta["target"] |= {"gpu_sku": "h100-80gb", "replicas": [{"id": "r0"}, {"id": "r1"}]}
    gateway, replicas = build(b, tmp_path / "reference")["scenario"]["stack"]
    assert gateway["standardized"]["kind"] == "generic"
    engine = replicas["standardized"]
    assert engine["kind"] == "inference_engine" and engine["replicas"] == 2
    assert engine["accelerator"]["model"] == "h100-80gb (simulated)"
    assert replicas["native"]["config"]["tenant_max_share"] == 0.15

    b.meta["target"] = {"kind": "vllm", "model": "tiny"}
    b.meta["plan"] = {"name": "vllm", "target": {"type": "vllm", "device": "cpu"}}
    (vllm,) = build(b, tmp_path / "vllm")["scenario"]["stack"]
    assert vllm["standardized"]["accelerator"] == {
        "model": "cpu",
        "count": 0,
        "parallelism": {"tp": 1, "dp": 1, "dp_local": 1, "workers": 1, "ep": 1, "pp": 1},
    }

    b.meta["target"] = {"kind": "sglang", "model": "theirs"}
    b.meta["plan"] = {"name": "external", "target": {"type": "external"}}
    (other,) = build(b, tmp_path / "external")["scenario"]["stack"]
    assert other["standardized"] == {
        "kind": "generic",
        "tool": "sglang",
        "tool_version": "unknown",
        "model": {"name": "theirs"},
    }


def test_no_key_of_the_plan_or_the_target_leaves_in_the_report(tmp_path: Path) -> None:
    secrets = ["sk-target-secret", "kvg-admin-secret", "kvg-owner-secret", "kvg-esc-secret"]
    b = RunBuilder().request("a", max_tokens=4)
    b.meta["plan"] = {
        "name": "keys",
        "target": {"type": "external", "api_key": secrets[0]},
        "traffic": {
            "classes": {
                "security_probe": {
                    "attributes": {
                        "owner": [secrets[2], "acme-demo", "acme"],
                        "escalations": [[secrets[3], "nightly-demo", "nightly", "critical"]],
                        "prober": ["kvg-globex-key", "globex-demo", "globex"],
                    }
                },
                "short_qa_interactive": {"attributes": {"api_key": "kvg-globex-key"}},
            }
        },
    }
    b.meta["target"]["config"] = {"admin_key": secrets[1], "tenant_max_share": 0.15}
    out = tmp_path / "report.yaml"
    exported(b.write(tmp_path / "run"), out)
    text = out.read_text()
    assert not [s for s in [*secrets, "kvg-globex-key"] if s in text]
    assert "<redacted>" in text and "acme-demo" in text and "tenant_max_share" in text


def test_a_run_of_one_class_reports_fixed_lengths_and_multi_turn_sessions(tmp_path: Path) -> None:
    b = RunBuilder()
    for i in range(3):
        b.request(
            f"t{i}", t=20.0 + i, traffic_class="multi_turn", target_prompt_tokens=128, max_tokens=64
        )
    load = build(b, tmp_path)["scenario"]["load"]["standardized"]
    assert load["input_seq_len"] == {"distribution": "fixed", "value": 128}
    assert load["output_seq_len"] == {"distribution": "fixed", "value": 64}
    assert load["multi_turn"] == {"enabled": True}
