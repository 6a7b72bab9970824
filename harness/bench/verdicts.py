"""`kvgate bench verdicts PLAN --runs N`: does the verdict hold on unchanged code?

Runs the same plan N times, each as its own `kvgate run` process (harness/qualify/runs.py),
and reports the distribution of its verdicts. Writes `verdicts.json` and `verdicts.md` into
the output folder; `--json` prints the summary as the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.bench.base import Bench, BenchUsageError, progress, run
from harness.qualify.runs import default_out, describe, markdown, run_once, summarise


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="plan YAML")
    parser.add_argument("--runs", type=int, default=10, help="how many runs (default 10)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for the runs and the summary"
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every run, one progress line each, then the summary files; the summary less its
    per-run records (verdicts.json keeps those)."""
    if args.runs < 1:
        raise BenchUsageError("--runs must be at least 1")
    if not Path(args.plan).is_file():
        raise BenchUsageError(f"no such plan file: {args.plan}")
    out = args.out or default_out("verdicts")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BenchUsageError(f"cannot create {out}: {exc.strerror}") from None
    records = []
    for i in range(args.runs):
        record = run_once(args.plan, args.overrides, out / f"run{i + 1:02d}")
        records.append(record)
        progress(f"run {i + 1}/{args.runs}: {describe(record)}")
    summary = summarise(records)
    (out / "verdicts.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "verdicts.md").write_text(markdown(summary, args.plan, args.overrides))
    print(f"wrote {out / 'verdicts.md'}")
    return {k: v for k, v in summary.items() if k != "records"}


BENCH = Bench(
    "kvgate bench verdicts",
    "Run one plan N times and report the distribution of its verdicts.",
    _options,
    measure,
    show=lambda summary: None,  # the progress lines and verdicts.md are the human's view
    json_help="print the summary JSON as the last line",
)


def main(argv: Sequence[str] | None = None) -> int:
    return run(BENCH, argv)
