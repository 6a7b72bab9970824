"""A series of runs of one plan, each as its own `kvgate run` process, and its distribution
rather than one lucky run: how often each verdict came out, and for every gate its status
counts, its value across runs, and its margin to the threshold in units of the run-to-run
spread (a gate within one spread of its line will flake). `kvgate bench verdicts` reports
one series (harness/bench/verdicts.py); `kvgate qualify` builds on the same records.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gates import schema
from gates.evidence import EvidenceReport
from gates.spec import Threshold

STATUSES = ("PASS", "MARGINAL", "FAIL", "INVALID")


def run_once(plan: str, overrides: Sequence[str], run_dir: Path) -> dict[str, Any]:
    """One `kvgate run` in its own process; what its verdict and meta say."""
    command = [sys.executable, "-m", "harness.cli", "run", plan, "--out", str(run_dir)]
    for item in overrides:
        command += ["--set", item]
    started = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    wall_s = time.monotonic() - started
    (run_dir.parent / f"{run_dir.name}.log").write_text(proc.stdout + proc.stderr)
    record: dict[str, Any] = {"run_dir": str(run_dir), "exit_code": proc.returncode}
    record["wall_s"] = round(wall_s, 1)
    verdict_path = run_dir / schema.VERDICT_FILE
    if not verdict_path.is_file():
        record |= {"status": "ERROR", "gates": {}, "problems": [proc.stderr[-500:]]}
        return record
    verdict = json.loads(verdict_path.read_text())
    meta = json.loads((run_dir / schema.META_FILE).read_text())
    record |= {
        "status": verdict["status"],
        "problems": verdict["run_problems"],
        # the evidence checks' reasons among them, for the detection matrix
        "evidence_problems": EvidenceReport.from_dict(verdict.get("evidence")).problems,
        "sim_lag_ms_p99": meta.get("sim_lag_ms_p99"),
        "cpu_warning": meta.get("cpu_warning"),
        "gates": {
            g["id"]: {
                "status": g["status"],
                "value": g["value"],
                "interval": g.get("interval"),
                "n": g["n_samples"],
                "censored": g.get("censored", 0),
                "threshold": g["threshold"],
                "key": g["key"],
            }
            for g in verdict["gates"]
        },
    }
    return record


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Verdict counts, and per gate its status counts, values and margin in spreads."""
    verdicts = Counter(r["status"] for r in records)
    gate_ids = list(dict.fromkeys(g for r in records for g in r["gates"]))
    gates: dict[str, Any] = {}
    for gate_id in gate_ids:
        seen = [r["gates"][gate_id] for r in records if gate_id in r["gates"]]
        # verdict.json spells a censored (+inf) value "inf"; float() reads both forms
        values = [float(g["value"]) for g in seen if g["value"] is not None]
        statuses = Counter(g["status"] for g in seen)
        threshold = Threshold.model_validate(seen[0]["threshold"])
        gates[gate_id] = {
            "key": seen[0]["key"],
            "threshold": seen[0]["threshold"],
            "statuses": dict(statuses),
            "not_pass": len(seen) - statuses.get("PASS", 0),
            "values": [json_number(v) for v in values],
            "n": [g["n"] for g in seen],
            "intervals": [g["interval"] for g in seen],
            "margin_spreads": json_number(_margin(values, threshold)),
        }
    return {
        "runs": len(records),
        "verdicts": {s: verdicts.get(s, 0) for s in (*STATUSES, "ERROR") if verdicts.get(s)},
        "gates": gates,
        "records": records,
    }


def json_number(value: float | None) -> float | str | None:
    """JSON has no infinity: +-inf are written as verdict.json writes them, "inf"/"-inf"."""
    if value is not None and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _margin(values: list[float], threshold: Threshold) -> float | None:
    """(distance of the mean to the line, toward passing) / run-to-run standard deviation."""
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < 2 or len(finite) < len(values):
        return None if len(finite) == len(values) else -math.inf
    spread = statistics.stdev(finite)
    mean = statistics.fmean(finite)
    distance = threshold.value - mean if threshold.higher_is_worse else mean - threshold.value
    if spread == 0:  # the same value every run: as far from the line as it can be, or on it
        return math.inf if threshold.holds(mean) else -math.inf
    return distance / spread


def markdown(summary: dict[str, Any], plan: str, overrides: Sequence[str]) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in summary["verdicts"].items())
    lines = [
        f"# Verdicts of {plan} {' '.join(f'--set {o}' for o in overrides)}".rstrip(),
        "",
        f"{summary['runs']} runs: {counts}",
        "",
        *gate_table(summary["gates"]),
        "",
        *run_table(summary["records"]),
    ]
    return "\n".join(lines) + "\n"


def gate_table(gates: dict[str, Any]) -> list[str]:
    """Markdown rows: each gate's statuses, values and margin across the runs (summarise's)."""
    lines = [
        "| gate | key | statuses | values (min / median / max) | n (min-max) | margin (spreads) |",
        "|---|---|---|---|---|---|",
    ]
    for gate_id, g in gates.items():
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(g["statuses"].items()))
        values = [float(v) for v in g["values"]]
        shown = (
            f"{min(values):.4g} / {statistics.median(values):.4g} / {max(values):.4g}"
            if values
            else "no data"
        )
        margin = g["margin_spreads"]
        margin_text = "" if margin is None else f"{float(margin):.2f}"
        lines.append(
            f"| {gate_id} | {'yes' if g['key'] else ''} | {statuses} | {shown} | "
            f"{min(g['n'])}-{max(g['n'])} | {margin_text} |"
        )
    return lines


def run_table(records: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown rows: one per run (run_once's records), with its verdict, exit code and lag."""
    lines = [
        "| run | verdict | exit | wall s | sim lag p99 ms | problems |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        problems = "; ".join(r.get("problems") or []).replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {Path(r['run_dir']).name} | {r['status']} | {r['exit_code']} | {r['wall_s']} | "
            f"{r.get('sim_lag_ms_p99')} | {problems} |"
        )
    return lines


def describe(record: dict[str, Any]) -> str:
    """`PASS (exit 0, 212.3 s)`: how one run ended, for the progress lines."""
    return f"{record['status']} (exit {record['exit_code']}, {record['wall_s']} s)"


def default_out(prefix: str) -> Path:
    """runs/PREFIX-YYYYmmdd-HHMMSS: where a series of runs goes unless --out says otherwise."""
    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
