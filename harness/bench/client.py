"""`kvgate bench client`: our streaming client against Locust's HttpUser and FastHttpUser.

Starts a reference replica, then runs each client variant in its own process
(client_worker.py) at the same number of concurrent streams, and reports TTFT error
against the server's emit time (`X-Kvgate-Debug-Timing: 1`) and content events handled per
client CPU-second. `ours_userspace` is our client with kernel receive stamps turned off.
The `control_*` figures repeat ours and httpuser against a control server
(client_control.py), which stamps each chunk just before writing it (the replica stamps a
whole step at once, before its writes), so there the TTFT error is the client's own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.bench.base import (
    REPO,
    Bench,
    BenchError,
    BenchUsageError,
    run,
    start_process,
    stop_process,
)

VARIANTS = ("ours", "ours_userspace", "httpuser", "fasthttp")
CONTROL_VARIANTS = ("ours", "httpuser")
TTFT_P99_TARGET_MS = 2.0
EVENTS_RATIO_TARGET = 3.0


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--streams", type=int, default=200, help="concurrent streams")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--measure-s", type=float, default=8.0)
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per stream")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated subset of {','.join(VARIANTS)} (ours and httpuser are needed "
        "for the ratio)",
    )
    parser.add_argument(
        "--url", help="measure against this running server instead of starting a replica"
    )
    parser.add_argument(
        "--no-control",
        action="store_true",
        help="skip the control run (ours and httpuser against client_control.py's server, "
        "which stamps each chunk as it writes it, so TTFT error is the client's own)",
    )


def _start(
    module: str, args: list[str], state: Path, name: str
) -> tuple[subprocess.Popen[bytes], str]:
    """Starts `python -m module ARGS` with its files under STATE; the process and its URL."""
    proc, ready = start_process(module, args, state / f"{name}.json", state / f"{name}.log")
    return proc, str(ready["url"])


def _run_variant(variant: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "harness.bench.client_worker",
        f"--variant={variant}",
        f"--url={url}",
        f"--streams={args.streams}",
        f"--warmup-s={args.warmup_s}",
        f"--measure-s={args.measure_s}",
        f"--max-tokens={args.max_tokens}",
    ]
    budget = args.warmup_s + args.measure_s + 60
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, timeout=budget, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"{variant} worker did not finish within {budget:g} s") from exc
    lines = done.stdout.decode().strip().splitlines()
    if done.returncode != 0 or not lines:
        raise BenchError(f"{variant} worker failed: {done.stderr.decode()[-1500:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _summary(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant, r in results.items():
        for key in ("ttft_err_ms_p50", "ttft_err_ms_p99", "events_per_cpu_s", "requests"):
            out[f"{variant}_{key}"] = r[key]
        out[f"{variant}_not_ok"] = r["not_ok"]
    if "ours" in results:
        out["ours_read_delay_ms_p50"] = results["ours"]["read_delay_ms_p50"]
        out["ours_read_delay_ms_p99"] = results["ours"]["read_delay_ms_p99"]
    ours, base = out.get("ours_events_per_cpu_s"), out.get("httpuser_events_per_cpu_s")
    out["ours_vs_httpuser_events_ratio"] = ours / base if ours and base else None
    p99 = out.get("ours_ttft_err_ms_p99")
    out["ours_ttft_p99_target_met"] = p99 is not None and p99 <= TTFT_P99_TARGET_MS
    ratio = out["ours_vs_httpuser_events_ratio"]
    out["ours_events_target_met"] = ratio is not None and ratio >= EVENTS_RATIO_TARGET
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        raise BenchUsageError(f"unknown --variants {unknown}; choose from {list(VARIANTS)}")
    started = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    control: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-client-") as tmp:
        state = Path(tmp)
        try:
            url = args.url
            if url is None:
                proc, url = _start(
                    "server.replica", ["--port", "0", "--state-dir", tmp], state, "replica"
                )
                procs.append(proc)
            results = {v: _run_variant(v, url, args) for v in variants}
            if not args.no_control:
                proc, control_url = _start("harness.bench.client_control", [], state, "c")
                procs.append(proc)
                control = {v: _run_variant(v, control_url, args) for v in CONTROL_VARIANTS}
        finally:
            for proc in procs:
                stop_process(proc)
    summary = _summary(results)
    for variant, r in control.items():
        for key in ("ttft_err_ms_p50", "ttft_err_ms_p99", "events_per_cpu_s"):
            summary[f"control_{variant}_{key}"] = r[key]
    summary.update(streams=args.streams, max_tokens=args.max_tokens, measure_s=args.measure_s)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    summary["detail"] = {**results, **{f"control_{v}": r for v, r in control.items()}}
    return summary


def _print_table(summary: dict[str, Any]) -> None:
    results: dict[str, dict[str, Any]] = summary["detail"]
    print(
        f"{'variant':16} {'ttft err p50 ms':>16} {'p99 ms':>9} {'events/CPU-s':>13} {'requests':>9}"
    )
    for variant, r in results.items():
        p50, p99 = r["ttft_err_ms_p50"], r["ttft_err_ms_p99"]
        print(
            f"{variant:16} {p50 if p50 is None else round(p50, 2)!s:>16} "
            f"{p99 if p99 is None else round(p99, 2)!s:>9} "
            f"{round(r['events_per_cpu_s'] or 0):>13} {r['requests']:>9}"
        )
    if "ours_read_delay_ms_p99" in summary:
        print(
            f"ours: first content read {summary['ours_read_delay_ms_p50']:.2f} ms (p50) / "
            f"{summary['ours_read_delay_ms_p99']:.2f} ms (p99) after the kernel received it; "
            "the rest of the TTFT error is the server's, between its stamp and its write"
        )
    ratio = summary["ours_vs_httpuser_events_ratio"]
    print(
        f"ours vs httpuser events/CPU-s: {'n/a' if ratio is None else f'{ratio:.2f}x'} "
        f"(target >= {EVENTS_RATIO_TARGET}x); ours TTFT p99 target <= {TTFT_P99_TARGET_MS} ms: "
        f"{'met' if summary['ours_ttft_p99_target_met'] else 'not met'}"
    )


BENCH = Bench("kvgate bench client", __doc__ or "", _options, measure, show=_print_table)


def main(argv: Sequence[str] | None = None) -> int:
    return run(BENCH, argv)
