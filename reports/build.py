"""Builds report.html (self-contained, charts inline), summary.md (a CI comment) and report.json.

The verdict comes from the run's verdict.json when the gates already ran (as `kvgate run`
does before reporting); otherwise the built-in gates are evaluated first.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gates import schema
from gates.evaluator import evaluate_run
from gates.rundir import RunData, load_run
from gates.verdict import Status, Verdict, _clean
from reports.charts import Rendered, env, render
from reports.figures import FIGURES

STATUS_COLORS = {
    Status.PASS: "#16a34a",
    Status.MARGINAL: "#ca8a04",
    Status.FAIL: "#dc2626",
    Status.INVALID: "#6b7280",
}


def load_verdict(run_dir: Path, run: RunData) -> Verdict:
    path = run_dir / schema.VERDICT_FILE
    if path.is_file():
        try:
            return Verdict.from_dict(json.loads(path.read_text()))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            pass  # stale or damaged: judge again below
    return evaluate_run(run_dir, run=run)


def write_reports(
    run_dir: Path, run: RunData | None = None, verdict: Verdict | None = None
) -> dict[str, Path]:
    """Write the three report files into `run_dir`; returns {"html"|"markdown"|"json": path}."""
    run_dir = Path(run_dir)
    data = run if run is not None else load_run(run_dir)
    judged = verdict if verdict is not None else load_verdict(run_dir, data)
    rendered: list[Rendered] = []
    numbers: dict[str, Any] = {}
    for figure in FIGURES:
        try:
            chart, summary = figure(data)
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            # One chart the data defeats must not cost the release manager the whole report.
            why = f"the chart could not be drawn ({type(exc).__name__}: {exc})"
            print(f"kvgate report: {figure.__name__}: {why}", file=sys.stderr)
            rendered.append(
                Rendered(figure.__name__, figure.__name__.replace("_", " "), None, why, "")
            )
            continue
        rendered.append(render(chart))
        numbers[chart.id] = summary
    paths = {
        "html": run_dir / schema.REPORT_HTML,
        "markdown": run_dir / schema.SUMMARY_MD,
        "json": run_dir / schema.REPORT_JSON,
    }
    context = _context(data, judged, rendered)
    paths["html"].write_text(env().get_template("report.html.j2").render(**context))
    paths["markdown"].write_text(
        env().get_template("summary.md.j2").render(**context, report_path=paths["html"])
    )
    report = {
        "verdict": judged.to_dict(),
        "run": _run_facts(data),
        "charts": {c.id: {"title": c.title, "empty": c.empty} for c in rendered},
        "data": numbers,
    }
    paths["json"].write_text(json.dumps(_clean(report), indent=1) + "\n")
    return paths


def _run_facts(run: RunData) -> dict[str, Any]:
    target = run.meta.get("target") or {}
    return {
        "path": str(run.path),
        "t_start": run.t_start,
        "t_end": run.t_end,
        "duration_s": run.t_end - run.t_start,
        "requests": len(run.requests),
        "server_events": len(run.server_events),
        "samples": len(run.samples),
        "faults": len(run.faults),
        "target": {
            k: target.get(k)
            for k in ("url", "kind", "model", "policy", "gpu_sku", "scheduler_config_digest")
        },
        "harness_version": run.meta.get("harness_version"),
        "sources": run.sources,
        "outcomes": {str(k): int(v) for k, v in run.requests["outcome"].value_counts().items()},
    }


def _when(epoch: float | None, run: RunData) -> str:
    if epoch is None:
        return ""
    stamp = datetime.fromtimestamp(epoch, UTC).strftime("%H:%M:%S")
    return f"{stamp} UTC (+{epoch - run.t_start:.1f} s)"


def _context(run: RunData, verdict: Verdict, charts: list[Rendered]) -> dict[str, Any]:
    return {
        "verdict": verdict,
        "color": STATUS_COLORS,
        "failed": verdict.failed,
        "charts": charts,
        "facts": _run_facts(run),
        "when": lambda t: _when(t, run),
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
