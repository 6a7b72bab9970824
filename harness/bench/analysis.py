"""`kvgate bench analysis [--json]`: gates plus reports over a large synthetic run directory.

The run (default 1,000,000 requests and 1,000,000 samples, as Parquet) is generated first
and not timed; the analysis then runs in a child process so its wall time and peak RSS
(resource.getrusage RUSAGE_CHILDREN) are its own. Targets: <= 20 s, <= 4 GiB, HTML < 5 MB.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from gates import schema
from harness.bench.base import Bench, BenchError, BenchUsageError, run
from reports.synthetic import make_run

TARGET_SECONDS = 20.0
TARGET_RSS_GIB = 4.0
TARGET_HTML_BYTES = 5_000_000
CHILD_TIMEOUT_S = 300
CHILD = (
    "import json, sys, time\n"
    "t0 = time.perf_counter()\n"
    "from pathlib import Path\n"
    "from gates.evaluator import evaluate_run\n"
    "from gates.rundir import load_run\n"
    "from reports.build import write_reports\n"
    "path = Path(sys.argv[1])\n"
    "run = load_run(path)\n"
    "t1 = time.perf_counter()\n"
    "verdict = evaluate_run(path, run=run)\n"
    "t2 = time.perf_counter()\n"
    "write_reports(path, run=run, verdict=verdict)\n"
    "t3 = time.perf_counter()\n"
    "print(json.dumps({'verdict': str(verdict.status), 'load_s': t1 - t0, 'gates_s': t2 - t1,"
    " 'reports_s': t3 - t2}))\n"
)


def analyse_in_child(run_dir: Path, timeout_s: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
    """Run load + gates + reports in a fresh interpreter; wall seconds and peak RSS of it."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(run_dir)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise BenchError(
            f"the analysis (load, gates, reports) did not finish within {timeout_s:g} s and was "
            f"stopped; give it longer with --timeout-s, or measure a smaller run"
        ) from None
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise BenchError(f"analysis child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    phases = json.loads(done.stdout.strip().splitlines()[-1])
    return {"seconds": round(seconds, 3), "peak_rss_gib": round(peak_kib / 2**20, 3), **phases}


def bench(
    n_requests: int, n_samples: int, keep: Path | None, timeout_s: float = CHILD_TIMEOUT_S
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-") as tmp:
        run_dir = keep or Path(tmp) / "run"
        t0 = time.perf_counter()
        make_run(run_dir, n_requests, n_samples, flavour="clean")
        generated_s = time.perf_counter() - t0
        result = analyse_in_child(run_dir, timeout_s)
        html = (run_dir / schema.REPORT_HTML).stat().st_size
        events = _rows(run_dir, schema.SERVER_EVENTS)
    result |= {
        "requests": n_requests,
        "samples": n_samples,
        "server_events": events,
        "generation_s_excluded": round(generated_s, 3),
        "html_bytes": html,
        "targets": {
            "seconds": TARGET_SECONDS,
            "peak_rss_gib": TARGET_RSS_GIB,
            "html_bytes": TARGET_HTML_BYTES,
        },
    }
    result["within_targets"] = (
        result["seconds"] <= TARGET_SECONDS
        and result["peak_rss_gib"] <= TARGET_RSS_GIB
        and html < TARGET_HTML_BYTES
    )
    return result


def _rows(run_dir: Path, table: str) -> int:
    return int(pq.ParquetFile(run_dir / f"{table}.parquet").metadata.num_rows)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.requests < 1 or args.samples < 1 or args.timeout_s <= 0:
        raise BenchUsageError("need --requests >= 1, --samples >= 1 and --timeout-s > 0")
    return bench(args.requests, args.samples, args.keep, args.timeout_s)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=1_000_000, help="synthetic requests")
    parser.add_argument("--samples", type=int, default=1_000_000, help="synthetic samples")
    parser.add_argument("--keep", type=Path, default=None, help="write the run here and keep it")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=CHILD_TIMEOUT_S,
        help="stop the analysis after this long and say so (default %(default)g)",
    )


BENCH = Bench("kvgate bench analysis", __doc__ or "", _options, measure)


def main(argv: Sequence[str] | None = None) -> int:
    return run(BENCH, argv)
