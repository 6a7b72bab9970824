"""Builds report.html (self-contained, charts inline), summary.md (a CI comment) and report.json.

The verdict comes from the run's verdict.json when the gates already ran (as `kvgate run`
does before reporting); otherwise the built-in gates are evaluated first.
"""

from __future__ import annotations

import inspect
import json
import sys
import time
from collections import Counter
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from gates import categories, schema
from gates.evaluator import evaluate, evaluate_run
from gates.evidence.kept import EFFECT_WORD, checks_seen
from gates.metrics import REGISTRY
from gates.metrics_capacity import curve as capacity_curve
from gates.metrics_security import side_channel
from gates.rundir import RunData, load_run
from gates.spec import GateSpecError, load_gate_file
from gates.terms import GateFilter
from gates.verdict import Status, Verdict, _clean
from reports.charts import Line, LineChart, Rendered, env, render
from reports.figures import FIGURES
from reports.outcomes import (
    outcome_table,
    release_probe,
    scrape_problems,
    server_counters,
    token_ratio,
)
from reports.replayed import replay_sentence

STATUS_COLORS = {
    Status.PASS: "#16a34a",
    Status.MARGINAL: "#ca8a04",
    Status.FAIL: "#dc2626",
    Status.INVALID: "#6b7280",
    Status.NA: "#9ca3af",
}


def load_verdict(run_dir: Path, run: RunData) -> Verdict:
    path = run_dir / schema.VERDICT_FILE
    if path.is_file():
        try:
            return Verdict.from_dict(json.loads(path.read_text()))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            pass  # stale or damaged: judge again below
    return evaluate_run(run_dir, run=run)


def judge_again(run_dir: Path, run: RunData) -> Verdict:
    """`run` judged again by the gates its verdict.json keeps (the built-in gates when the
    run has no verdict yet), over whatever profile `run` was loaded with; writes nothing,
    so the run's own verdict stays as it was judged."""
    path = run_dir / schema.VERDICT_FILE
    if not path.is_file():
        return evaluate(run, load_gate_file())
    try:
        kept = Verdict.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise GateSpecError(
            f"{path} cannot be read ({type(exc).__name__}: {exc}); judge the run again with "
            "`kvgate gate RUN_DIR --gates FILE`"
        ) from exc
    return evaluate(run, kept.gate_file(), kept.gates_file)


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
            # A chart that draws a gate's line asks for the verdict (a `verdict` parameter).
            wants_verdict = "verdict" in inspect.signature(figure).parameters
            chart, summary = figure(data, verdict=judged) if wants_verdict else figure(data)
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
    for chart in trend_charts(data, judged):
        rendered.append(render(chart))
    paths = {
        "html": run_dir / schema.REPORT_HTML,
        "markdown": run_dir / schema.SUMMARY_MD,
        "json": run_dir / schema.REPORT_JSON,
    }
    context = _context(data, judged, rendered)
    timing = context["side_channel"]
    paths["html"].write_text(env().get_template("report.html.j2").render(**context))
    paths["markdown"].write_text(
        env().get_template("summary.md.j2").render(**context, report_path=paths["html"])
    )
    report = {
        "verdict": judged.to_dict(),
        "run": _run_facts(data),
        "charts": {c.id: {"title": c.title, "empty": c.empty} for c in rendered},
        "data": numbers,
        # Informational, not a gate: TTFT of a cross-tenant prefix probe minus its control.
        "side_channel": None if timing is None else asdict(timing),
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
            for k in (
                "url",
                "kind",
                "model",
                "policy",
                "mutant",
                "gpu_sku",
                "scheduler_config_digest",
            )
        },
        "harness_version": run.meta.get("harness_version"),
        "stopped_early": (run.meta.get("load_generator") or {}).get("stopped_early"),
        # meta.json says "running" while the load goes on: this report is an interim one
        "interim_at_s": (
            time.time() - run.t_start if run.meta.get("status") == "running" else None
        ),
        "sources": run.sources,
        "outcomes": {str(k): int(v) for k, v in categories.counts(run.requests["outcome"]).items()},
        "replay": replay_sentence(run.meta),
    }


def trend_charts(run: RunData, verdict: Verdict) -> list[LineChart]:
    """For each drift gate (a `series` metric) that judged: its value per window and the
    fitted line whose slope it judged, computed with the gate's own parameters as its
    verdict keeps them (a soak's 30 s windows are drawn as 30 s windows)."""
    charts = []
    for gate in verdict.gates:
        definition = REGISTRY.get(gate.metric)
        if definition is None or definition.kind != "series" or gate.status == Status.NA:
            continue
        kept = gate.spec.get("params")
        params = kept if isinstance(kept, dict) else {}
        obs = definition.compute(run, GateFilter(**gate.filter), params)
        if obs.n_samples < 2:
            continue
        minutes = (obs.frame["t"].to_numpy(dtype=float) - run.t_start) / 60.0
        values = obs.frame["value"].to_numpy(dtype=float)
        slope, intercept = np.polyfit(minutes, values, 1)
        charts.append(
            LineChart(
                id=f"trend-{gate.id}",
                title=f"{gate.title} ({gate.status}: {gate.value_text()} per hour)",
                x_label="minutes into the run",
                y_label=definition.unit,
                lines=[
                    Line("per window", list(minutes), list(values)),
                    Line("fitted", list(minutes), list(intercept + slope * minutes)),
                ],
                caption="The gate judges the fitted line's slope per hour, with its interval."
                + (
                    ""
                    if isinstance(kept, dict)
                    else " Drawn with the metric's default parameters: this verdict.json "
                    "does not keep the gate's."
                ),
            )
        )
    return charts


def capacity_rows(run: RunData) -> list[dict[str, str]]:
    """The capacity curve (gates/metrics_capacity.py) as display strings, one per step."""
    table = capacity_curve(run)

    def show(value: Any, digits: str = ".3g") -> str:
        return (
            ""
            if value is None or (isinstance(value, float) and value != value)
            else format(value, digits)
        )

    return [
        {
            "users": show(r.get("users"), "g"),
            "sent": show(r.get("sent"), "g"),
            "completed": show(r.get("completed_per_s"), ".2f"),
            "goodput": show(r.get("goodput_per_s"), ".2f"),
            "ttft_p95": show(r.get("ttft_p95_critical", r.get("ttft_p95_interactive"))),
            "pool": show(r.get("pool_usage"), ".2f"),
            "refused": f"{r.get('refused_capacity', 0)} / {r.get('refused_policy', 0)}",
            "timeouts": show(r.get("timeouts"), "g"),
        }
        for r in table.to_dict("records")
    ]


def _when(epoch: float | None, run: RunData) -> str:
    if epoch is None:
        return ""
    stamp = datetime.fromtimestamp(epoch, UTC).strftime("%H:%M:%S")
    return f"{stamp} UTC (+{epoch - run.t_start:.1f} s)"


def _tally(verdict: Verdict) -> str:
    """`2 FAIL, 1 MARGINAL, 6 PASS of 9 gates`: the verdict's make-up in one phrase."""
    counts = Counter(g.status for g in verdict.gates)
    worst_first = (Status.FAIL, Status.INVALID, Status.MARGINAL)
    parts = [f"{counts[s]} {s}" for s in worst_first if counts[s]]
    parts.append(f"{counts[Status.PASS]} PASS")
    applied = len(verdict.gates) - counts[Status.NA]
    tally = f"{', '.join(parts)} of {applied} gates"
    return tally + (f" ({counts[Status.NA]} N/A for this target)" if counts[Status.NA] else "")


def _confidence(verdict: Verdict) -> str:
    """`95%` when every gate's interval has the same confidence (the table's header says it)."""
    levels = {g.confidence for g in verdict.gates}
    return f"{100 * levels.pop():g}%" if len(levels) == 1 else "each gate's"


def _cell(text: object) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _evidence(item: dict[str, Any], run: RunData) -> str:
    return " ".join(
        f"{k}={_when(v, run) if k == 't' else (f'{v:.4g}' if isinstance(v, float) else v)}"
        for k, v in item.items()
    )


def _context(run: RunData, verdict: Verdict, charts: list[Rendered]) -> dict[str, Any]:
    failed = verdict.failed
    return {
        "verdict": verdict,
        "color": STATUS_COLORS,
        "failed": failed,
        # Gates that did not pass first (worst first), then the rest in the gate file's order.
        "ordered": failed
        + [g for g in verdict.gates if g.status == Status.PASS]
        + verdict.not_applicable,
        "tally": _tally(verdict),
        "confidence": _confidence(verdict),
        "cell": _cell,
        "evidence": lambda item: _evidence(item, run),
        "charts": charts,
        "facts": _run_facts(run),
        "when": lambda t: _when(t, run),
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "side_channel": side_channel(run),
        "outcomes": outcome_table(run),
        "scrape_problems": scrape_problems(run),
        "release_probe": release_probe(run),
        "token_ratio": token_ratio(run),
        "capacity_steps": capacity_rows(run),
        "server_counters": server_counters(run),
        "not_applicable": verdict.not_applicable,
        # What the evidence checks found before any gate (empty for an older verdict.json).
        "evidence_checks": checks_seen(verdict.evidence),
        "effect_word": EFFECT_WORD,
    }
