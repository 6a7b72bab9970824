"""`kvgate capacity RUN_DIR [RUN_DIR ...] [--out DIR]`: capacity runs side by side.

Each run is a step-ramp capacity run (harness/plans/capacity.yaml), typically the same plan
against each scheduler policy (`--set target.policy=vllm`, ...). Writes capacity.md and
capacity.html into --out (default: the first run): goodput and TTFT p95 against load, one
line per run, the capacity each held below every knee, its goodput there, and each run's
goodput relative to the first. Exit 0, or 2 for bad input.
"""

from __future__ import annotations

import html
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gates.metrics import REGISTRY
from gates.metrics_capacity import curve
from gates.rundir import RunDirError, load_run
from gates.terms import GateFilter
from reports.charts import Line, LineChart, render
from reports.cli import Parser, parse

EXIT_USAGE = 2


@dataclass(slots=True)
class CapacityRun:
    label: str
    path: Path
    table: pd.DataFrame
    capacity_users: float | None
    goodput: float | None
    bracket: tuple[object, object]


def _one(path: Path) -> CapacityRun:
    run = load_run(path)
    target = run.meta.get("target") or {}
    label = str(target.get("policy") or target.get("kind") or path.name)
    if target.get("mutant"):
        label += f" ({target['mutant']})"
    values = {}
    for name in ("capacity_at_slo", "goodput_at_slo"):
        obs = REGISTRY[name].compute(run, GateFilter(), {})
        values[name] = (
            float(obs.frame["value"].iloc[0]) if obs.n_samples and len(obs.frame) else None
        )
    cap = run.meta.get("capacity") or {}
    bracket = (cap.get("capacity_users"), cap.get("capacity_bound_users"))
    return CapacityRun(
        label, path, curve(run), values["capacity_at_slo"], values["goodput_at_slo"], bracket
    )


def report(runs: list[CapacityRun]) -> tuple[str, str]:
    """(markdown, html) of the runs side by side."""
    base = runs[0].goodput
    lines_md = [
        "## kvgate capacity: runs side by side",
        "",
        "| run | capacity at the SLO (users) | bracket (held / did not) "
        "| goodput at the SLO (req/s) | vs the first |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    for r in runs:
        ratio = f"{r.goodput / base:.2f}x" if r.goodput and base else "n/a"
        lines_md.append(
            f"| {r.label} | {_num(r.capacity_users)} | {_num(r.bracket[0])} / "
            f"{_num(r.bracket[1])} | {_num(r.goodput)} | {ratio} |"
        )
    lines_md += ["", "Goodput: requests per second served within their SLO (TTFT per class, "
                 "time per output token), DistServe's definition.", ""]  # fmt: skip
    charts = [
        LineChart(
            id=f"capacity-{metric}",
            title=title,
            x_label="concurrent users (step)",
            y_label=unit,
            lines=[
                Line(r.label, list(r.table["users"].astype(float)), list(r.table[metric]))
                for r in runs
                if not r.table.empty and metric in r.table
            ],
            empty="no capacity steps in these runs",
        )
        for metric, title, unit in (
            ("goodput_per_s", "Goodput against load", "requests/s within SLO"),
            ("completed_per_s", "Completed requests against load", "requests/s"),
            ("ttft_p95_critical", "Critical TTFT p95 against load", "s"),
        )
    ]
    rendered = [render(c) for c in charts]
    body = "".join(
        f"<figure><figcaption>{html.escape(c.title)}</figcaption>"
        f"{c.svg if c.svg is not None else html.escape(c.empty or '')}</figure>"
        for c in rendered
    )
    rows = "".join(
        f"<tr><td>{html.escape(r.label)}</td><td>{_num(r.capacity_users)}</td>"
        f"<td>{_num(r.bracket[0])} / {_num(r.bracket[1])}</td><td>{_num(r.goodput)}</td></tr>"
        for r in runs
    )
    page = (
        "<!doctype html><meta charset='utf-8'><title>kvgate capacity</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:20px}td,th{padding:4px 10px;"
        "border-bottom:1px solid #e5e7eb}</style><h1>kvgate capacity: runs side by side</h1>"
        "<table><tr><th>run</th><th>capacity at the SLO (users)</th><th>bracket</th>"
        f"<th>goodput at the SLO (req/s)</th></tr>{rows}</table>{body}"
    )
    return "\n".join(lines_md), page


def _num(value: object) -> str:
    return "n/a" if not isinstance(value, int | float) else f"{value:.3g}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="kvgate capacity", description=__doc__)
    parser.add_argument("runs", type=Path, nargs="+", help="capacity run directories")
    parser.add_argument(
        "--out", type=Path, default=None, help="where to write (default: first run)"
    )
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    try:
        runs = [_one(path) for path in args.runs]
    except (RunDirError, ValueError) as exc:
        print(f"kvgate capacity: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = args.out or args.runs[0]
    markdown, page = report(runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "capacity.md").write_text(markdown + "\n")
    (out / "capacity.html").write_text(page)
    print(markdown)
    print(f"kvgate capacity: wrote {out / 'capacity.md'} and {out / 'capacity.html'}")
    return 0
