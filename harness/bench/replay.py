"""`kvgate bench replay`: how punctually one load-generator process replays a trace.

Writes a trace of `--rate` requests a second for `--duration-s` seconds (arrivals at even
intervals, short prompts that share a prefix, short answers), replays it open loop against
the reference server with `kvgate run` (one replica, the virtual GPU ten times as fast, so
the server is not what is measured), and reports the schedule error of its requests,
`t_send - t_scheduled` in ms (p50, p99, max, and the p99 of each tenth of the replay: a
schedule that drifts grows from the first tenth to the last), the requests not sent, and
the load generator's CPU, as meta.json's `replay` keeps them. A benchmark, not a test: its
figures are the machine's. The target (`SCHEDULE_ERROR_TARGET_MS`, harness/plan_trace.py)
is a p99 of at most 5 ms at 100 requests a second.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contract.trace import TraceRequest, write_mooncake
from harness.bench.base import REPO, Bench, BenchError, BenchUsageError, progress, run
from harness.plan_trace import SCHEDULE_ERROR_TARGET_MS

PLAN = """
name: bench-replay
seed: 1
target: {{type: reference, replicas: 1, time_scale: 0.1}}
load: {{idle_before_s: 1, idle_after_s: 1, stop_if_failing: null}}
traffic:
  trace: {{path: {trace}, drain_s: 5, timeout_s: 30, rules: [{{tenant: acme}}]}}
faults: []
"""
SLICES = 10  # the replay's tenths, for drift
RUN_SLACK_S = 180.0  # start-up, teardown and compaction around the load


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=100.0, help="requests a second (100)")
    parser.add_argument("--duration-s", type=float, default=60.0, help="seconds of replay (60)")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="tokens a prompt (256)")
    parser.add_argument("--out", type=Path, default=None, help="keep the run here")


def write_trace(path: Path, rate: float, duration_s: float, prompt_tokens: int) -> int:
    """Evenly spaced requests, each with the shared first block and one of its own."""
    count = max(1, int(rate * duration_s))
    blocks = -(-prompt_tokens // 512)
    with path.open("w") as out:
        write_mooncake(
            (
                TraceRequest(
                    i / rate, prompt_tokens, 8, (0, *range(1 + i * blocks, i * blocks + blocks))
                )
                for i in range(count)
            ),
            out,
        )
    return count


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.rate <= 0 or args.duration_s <= 0 or args.prompt_tokens < 1:
        raise BenchUsageError("--rate, --duration-s and --prompt-tokens must be positive")
    work = Path(args.out or tempfile.mkdtemp(prefix="kvgate-bench-replay-"))
    work.mkdir(parents=True, exist_ok=True)
    trace = work / "trace.jsonl"
    count = write_trace(trace, args.rate, args.duration_s, args.prompt_tokens)
    plan = work / "plan.yaml"
    plan.write_text(PLAN.format(trace=trace))
    run_dir = work / "run"
    progress(f"replaying {count} requests at {args.rate:g}/s into {run_dir}")
    cmd = [sys.executable, "-m", "harness.run_cmd", str(plan), "--out", str(run_dir), "--no-gates"]
    try:
        done = subprocess.run(
            cmd,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=args.duration_s + RUN_SLACK_S,
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"the replay ran past {args.duration_s + RUN_SLACK_S:.0f} s") from None
    if done.returncode != 0:
        raise BenchError(f"kvgate run exited {done.returncode}:\n{done.stderr[-1500:]}")
    return summarise(run_dir, args.rate, count)


def summarise(run_dir: Path, rate: float, count: int) -> dict[str, Any]:
    """The replay's figures from its run directory."""
    from gates.categories import counts
    from gates.rundir import load_run
    from harness.replay import errors_ms

    meta = json.loads((run_dir / "meta.json").read_text())
    replay = meta.get("replay") or {}
    requests = load_run(run_dir).requests
    replayed = requests[requests["t_scheduled"].notna()].sort_values("t_scheduled")
    late = errors_ms(replayed)
    if not len(late):
        raise BenchError(f"no replayed request in {run_dir}")
    tenths = [float(np.percentile(part, 99)) for part in np.array_split(late, SLICES) if len(part)]
    return {
        "rate_per_s": rate,
        "requests": count,
        "sent": replay.get("sent"),
        "unsent": replay.get("unsent"),
        "schedule_error_ms_p50": float(np.percentile(late, 50)),
        "schedule_error_ms_p99": float(np.percentile(late, 99)),
        "schedule_error_ms_max": float(late.max()),
        "schedule_error_ms_p99_by_tenth": [round(v, 3) for v in tenths],
        "target_p99_ms": SCHEDULE_ERROR_TARGET_MS,
        "load_generator_cpu_cores_mean": replay.get("load_generator_cpu_cores_mean"),
        "outcomes": counts(requests["outcome"]).to_dict(),
        "run_dir": str(run_dir),
    }


BENCH = Bench(
    prog="kvgate bench replay",
    description=__doc__ or "",
    options=_options,
    measure=measure,
)


def main(argv: Sequence[str] | None = None) -> int:
    return run(BENCH, argv)
