"""`kvgate bench analysis [--json]`: gates plus reports over a large synthetic run directory.

The run (default 1,000,000 requests and 1,000,000 samples, as Parquet) is generated first,
in a child process of its own, and not timed (`--run DIR` measures a run kept earlier with
`--keep DIR` instead). The analysis then runs in a fresh child process, which reports its own
wall time and peak RSS. Targets: 6 s and 0.8 GiB per million requests (60 s and 8 GiB at ten
million: the cost of a multi-day soak's rows grows linearly), at least 1 GiB; HTML < 5 MB.
"""

from __future__ import annotations

import argparse
import json
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

TARGET_SECONDS_PER_MILLION = 6.0
TARGET_RSS_GIB_PER_MILLION = 0.8
TARGET_RSS_GIB_MIN = 1.0  # the interpreter and its libraries, before any row
TARGET_HTML_BYTES = 5_000_000
CHILD_TIMEOUT_S = 300
GENERATE_TIMEOUT_S = 1800
CHILD = (
    "import json, resource, sys, time\n"
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
    "peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "print(json.dumps({'verdict': str(verdict.status), 'load_s': t1 - t0, 'gates_s': t2 - t1,"
    " 'reports_s': t3 - t2, 'peak_rss_gib': peak_kib / 2**20}))\n"
)
# Generating ten million requests takes far more memory than judging them: in a process of
# its own, that memory is given back before the analysis starts.
GENERATE = (
    "import sys\n"
    "from pathlib import Path\n"
    "from reports.synthetic import make_run\n"
    "make_run(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), flavour='clean')\n"
)


def analyse_in_child(run_dir: Path, timeout_s: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
    """Run load + gates + reports in a fresh interpreter; its wall seconds and peak RSS."""
    start = time.perf_counter()
    done = _child(CHILD, [str(run_dir)], timeout_s, "the analysis (load, gates, reports)")
    seconds = time.perf_counter() - start
    phases = json.loads(done.strip().splitlines()[-1])
    phases["peak_rss_gib"] = round(phases["peak_rss_gib"], 3)
    return {"seconds": round(seconds, 3), **phases}


def _child(code: str, args: list[str], timeout_s: float, what: str) -> str:
    """`python -c CODE ARGS`; its stdout. BenchError when it fails or outlives `timeout_s`."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise BenchError(
            f"{what} did not finish within {timeout_s:g} s and was stopped; give it longer "
            f"with --timeout-s, or measure a smaller run"
        ) from None
    if done.returncode != 0:
        raise BenchError(f"{what} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


def targets(n_requests: int) -> dict[str, float]:
    millions = n_requests / 1e6
    return {
        "seconds": round(TARGET_SECONDS_PER_MILLION * millions, 3),
        "peak_rss_gib": round(max(TARGET_RSS_GIB_PER_MILLION * millions, TARGET_RSS_GIB_MIN), 3),
        "html_bytes": TARGET_HTML_BYTES,
    }


def bench(
    n_requests: int,
    n_samples: int,
    keep: Path | None,
    timeout_s: float = CHILD_TIMEOUT_S,
    existing: Path | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-") as tmp:
        run_dir = existing or keep or Path(tmp) / "run"
        generated_s = None
        if existing is None:
            t0 = time.perf_counter()
            sizes = [str(run_dir), str(n_requests), str(n_samples)]
            _child(GENERATE, sizes, GENERATE_TIMEOUT_S, "generating the synthetic run")
            generated_s = round(time.perf_counter() - t0, 3)
        result = analyse_in_child(run_dir, timeout_s)
        html = (run_dir / schema.REPORT_HTML).stat().st_size
        requests = _rows(run_dir, schema.REQUESTS)
        result |= {
            "requests": requests,
            "samples": _rows(run_dir, schema.SAMPLES),
            "server_events": _rows(run_dir, schema.SERVER_EVENTS),
        }
    goal = targets(requests)
    result |= {
        "generation_s_excluded": generated_s,
        "html_bytes": html,
        "targets": goal,
        "within_targets": result["seconds"] <= goal["seconds"]
        and result["peak_rss_gib"] <= goal["peak_rss_gib"]
        and html < goal["html_bytes"],
    }
    return result


def _rows(run_dir: Path, table: str) -> int:
    return int(pq.ParquetFile(run_dir / f"{table}.parquet").metadata.num_rows)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.requests < 1 or args.samples < 1 or args.timeout_s <= 0:
        raise BenchUsageError("need --requests >= 1, --samples >= 1 and --timeout-s > 0")
    if args.run is not None and not (args.run / f"{schema.REQUESTS}.parquet").is_file():
        raise BenchUsageError(
            f"--run {args.run} holds no {schema.REQUESTS}.parquet; pass a directory that "
            "--keep wrote"
        )
    return bench(args.requests, args.samples, args.keep, args.timeout_s, args.run)


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=1_000_000, help="synthetic requests")
    parser.add_argument("--samples", type=int, default=1_000_000, help="synthetic samples")
    parser.add_argument("--keep", type=Path, default=None, help="write the run here and keep it")
    parser.add_argument(
        "--run",
        type=Path,
        default=None,
        help="measure this run directory (written by --keep) instead of generating one",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=CHILD_TIMEOUT_S,
        help="stop the analysis after this long and say so (default %(default)g)",
    )


BENCH = Bench("kvgate bench analysis", __doc__ or "", _options, measure)


def main(argv: Sequence[str] | None = None) -> int:
    return run(BENCH, argv)
