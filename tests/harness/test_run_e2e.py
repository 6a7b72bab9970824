"""`kvgate run` end to end against the embedded reference deployment (processes on loopback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
from llmd_benchmark_report import import_benchmark_report

import contract
from contract.host import HostCpu
from contract.trace import MOONCAKE_BLOCK_TOKENS, read_trace
from gates import schema
from gates.rundir import load_run
from harness.run_cmd import main
from reports.export.cli import main as export

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "harness" / "plans" / "smoke.yaml"
CLASSES = set(contract.TRAFFIC_CLASSES)


def kvgate_run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "harness.run_cmd", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def started_pids(run_dir: Path) -> list[int]:
    ready = json.loads((run_dir / "server" / "ready.json").read_text())
    return [int(ready["pid"])] + [int(r["pid"]) for r in ready["replicas"]]


def assert_all_stopped(pids: list[int]) -> None:
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not alive, f"processes the run started are still alive: {alive}"


def wait_for_file_content(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"{path} got no content within {timeout}s")


@pytest.mark.e2e
def test_smoke_plan_writes_a_complete_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "smoke"
    proc = kvgate_run(str(SMOKE), "--out", str(run_dir), timeout=90)
    verdict = json.loads((run_dir / schema.VERDICT_FILE).read_text())
    assert proc.returncode == verdict["exit_code"], proc.stderr[-3000:]
    assert "kvgate: verdict" in proc.stdout and (run_dir / "report.html").exists()
    run = load_run(run_dir)
    assert all(run.sources[t] == "parquet" for t in schema.TABLES)
    meta = run.meta
    assert meta["status"] == "completed" and set(schema.META_KEYS) <= set(meta)
    assert meta["windows"]["stress"][0] < meta["windows"]["stress"][1]
    assert meta["target"]["kind"] == "reference" and meta["target"]["gpu_sku"] == "h100-80gb"
    assert meta["sim_lag_ms_p99"] is not None
    # the load generator's own loop, measured while the load ran, and the bound it is held to
    lag = meta["load_generator"]["loop_lag_ms"]
    assert lag["ticks"] > 100 and 0 < lag["p50"] <= lag["p99"] <= lag["max"]
    assert meta["load_generator"]["loop_lag_bound_ms"] == 50.0
    requests = run.requests
    assert set(requests["traffic_class"]) == CLASSES
    assert requests["request_id"].is_unique and len(requests) == meta["records"]["written"]
    assert (requests["outcome"] == "ok").sum() > len(requests) / 2
    events = run.server_events
    assert {"admitted", "finished", "released"} <= set(events["event"])
    died = events[(events["event"] == "replica_died") & (events["replica"] == "r1")]
    assert len(died) >= 1
    sources = set(run.samples["source"])
    assert {"prometheus", "process", "host"} <= sources and sources & {"nvml", "sim_gpu"}
    # the host's CPU: the reference server is kvgate's child, so the target's tree is found
    # and the foreign CPU measured; the bounds it is judged by are the run's
    host = run.samples[run.samples["source"].eq("host")]
    assert {HostCpu.FOREIGN, HostCpu.KVGATE, HostCpu.TARGET} <= set(host["metric"])
    assert (host.loc[host["metric"].eq(HostCpu.KVGATE), "value"] > 0).any()
    assert meta["foreign_cpu_bound_share"] == 0.25
    [fault] = run.faults.to_dict("records")
    assert fault["kind"] == "kill" and fault["outcome"] == "ok"
    assert fault["rollback"].startswith("restarted")
    assert_all_stopped(started_pids(run_dir))
    assert_exports(run_dir, requests, meta)


def assert_exports(run_dir: Path, requests: pd.DataFrame, meta: dict[str, object]) -> None:
    """A real run's requests carry their prompt blocks, export as a trace with the run's
    schedule and lengths, and as an llm-d report the llm-d package validates."""
    assert meta["prompt_block_tokens"] == MOONCAKE_BLOCK_TOKENS
    blocks = requests["prompt_blocks"].str.split(" ").str.len()
    assert (blocks == np.ceil(requests["target_prompt_tokens"] / MOONCAKE_BLOCK_TOKENS)).all()
    assert export([str(run_dir), "--format", "mooncake"]) == 0
    trace = read_trace(run_dir / schema.MOONCAKE_TRACE)
    sent = requests[requests["probe"].isna()].sort_values("t_send", kind="stable")
    assert [r.input_tokens for r in trace.requests] == sent["target_prompt_tokens"].tolist()
    assert [r.output_tokens for r in trace.requests] == sent["max_tokens"].tolist()
    ms = ((sent["t_send"] - sent["t_send"].min()) * 1000).round() / 1000
    assert [r.t_s for r in trace.requests] == ms.tolist()
    assert export([str(run_dir), "--format", "llmd"]) == 0
    report = import_benchmark_report(str(run_dir / schema.LLMD_REPORT)).dump()
    counted = report["results"]["request_performance"]["aggregate"]["requests"]
    assert counted["total"] == len(requests)


@pytest.mark.e2e
def test_two_worker_processes_merge_into_one_run_without_loss(tmp_path: Path) -> None:
    run_dir = tmp_path / "dist"
    quick = ["load.duration_s=10", "load.idle_before_s=1", "load.idle_after_s=1", "faults=[]"]
    sets = [arg for s in quick for arg in ("--set", s)]
    proc = kvgate_run(
        str(SMOKE), "--out", str(run_dir), "--processes", "2", "--no-gates", *sets, timeout=90
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "did not quit" not in proc.stderr  # workers leave by themselves once done
    run = load_run(run_dir)
    relay = run.meta["records"]["relay"]
    assert len(relay["sent"]) == 2 and all(n > 0 for n in relay["sent"].values())
    lag = run.meta["load_generator"]["loop_lag_ms"]  # the workers' loops, merged by the master
    assert lag["ticks"] > 0 and lag["p50"] <= lag["p99"] <= lag["max"]
    assert relay["sent"] == relay["received"]
    requests = run.requests
    assert len(requests) == sum(relay["sent"].values())
    assert requests["request_id"].is_unique
    assert requests["worker"].nunique() == 2
    seen_by_server = set(run.server_events["request_id"].dropna())
    assert seen_by_server and seen_by_server <= set(requests["request_id"])
    assert_all_stopped(started_pids(run_dir))


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_interrupt_stops_everything_and_keeps_the_partial_run(tmp_path: Path, sig: int) -> None:
    run_dir = tmp_path / "interrupted"
    cmd = [
        sys.executable,
        "-m",
        "harness.run_cmd",
        str(SMOKE),
        "--out",
        str(run_dir),
        "--set",
        "load.idle_before_s=0",
    ]
    with (tmp_path / "out.log").open("w") as log:
        # Ctrl-C's default, as a terminal gives it: a suite started in the background (as
        # `make test` starts this file) hands its children SIGINT ignored, and Python then
        # never turns SIGINT into KeyboardInterrupt.
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            wait_for_file_content(run_dir / "requests.jsonl", timeout=40)
            os.kill(proc.pid, sig)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = (tmp_path / "out.log").read_text()
    assert proc.returncode == 130, output[-3000:]
    meta = json.loads((run_dir / schema.META_FILE).read_text())
    assert meta["status"] == "interrupted"
    assert len(pd.read_parquet(run_dir / "requests.parquet")) > 0
    assert_all_stopped(started_pids(run_dir))


def test_a_bad_plan_exits_2_naming_the_yaml_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "bad.yaml"
    plan.write_text("traffic: {classes: {batch: {weight: 1}}}\nload: {shape: ramp}\n")
    assert main([str(plan)]) == 2
    err = capsys.readouterr().err
    assert "load.shape: Input should be 'constant', 'step_ramp', 'soak' or 'peak_trough'" in err
    assert main([str(SMOKE), "--set", "target.policy=greedy"]) == 2
    assert "target.policy" in capsys.readouterr().err


def test_a_bad_gate_file_exits_2_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gates = tmp_path / "gates.yaml"
    gates.write_text('gates:\n  - {id: x, title: X, metric: nope, pass: "count == 0"}\n')
    out = tmp_path / "run"
    assert main([str(SMOKE), "--set", f"gates={gates}", "--out", str(out)]) == 2
    assert "metric 'nope' is unknown" in capsys.readouterr().err
    assert not out.exists(), "nothing may start (or be written) for a plan that cannot be judged"


@pytest.mark.e2e
def test_a_target_that_cannot_start_is_an_internal_error_with_its_log(tmp_path: Path) -> None:
    run_dir = tmp_path / "broken"
    proc = kvgate_run(
        str(SMOKE), "--out", str(run_dir), "--set", "target.extra_args=[--no-such-flag]", timeout=60
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "the reference server exited with code" in proc.stderr
    meta = json.loads((run_dir / schema.META_FILE).read_text())
    assert meta["status"] == "error" and "TargetError" in meta["error"]
    assert "TargetError" in (run_dir / "harness-error.log").read_text()
    assert all((run_dir / f"{t}.parquet").exists() for t in schema.TABLES)
