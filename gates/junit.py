"""JUnit XML for CI: one test case per gate, plus one for the run's validity.

Each gate's case carries its value as `GateResult.value_text()` (statistic, interval, n) in
the failure/error message or system-out, and per-case properties with the interval, its
confidence and method, and the caveats (an interval straddling the line, the samples a
conclusive judgement needs), so a CI page shows how sure the verdict is without verdict.json.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

from gates.verdict import GateResult, Status, Verdict

SUITE = "kvgate.gates"


def _number(value: float) -> str:
    # JUnit properties are strings; "inf" matches how verdict.json writes an unbounded end.
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:g}"


def _properties(case: ET.Element, gate: GateResult) -> None:
    """Per-case properties (read by GitLab, Jenkins and pytest-style JUnit consumers)."""
    props = ET.SubElement(case, "properties")
    items = [("status", str(gate.status)), ("value", gate.value_text())]
    items.append(("threshold", gate.threshold))
    if gate.interval is not None:
        lo, hi = gate.interval
        items.append(("interval", f"[{_number(lo)}, {_number(hi)}]"))
        items.append(("confidence", f"{gate.confidence:g}"))
    if gate.method:
        items.append(("method", gate.method))
    items.append(("n", str(gate.n_samples)))
    items.append(("straddles", "true" if gate.straddles else "false"))
    if gate.needs_n is not None:
        items.append(("needs_n", str(gate.needs_n)))
    if gate.censored:
        items.append(("censored", str(gate.censored)))
    for name, value in items:
        ET.SubElement(props, "property", name=name, value=value)


def _headline(gate: GateResult) -> str:
    """`p(95) = 0.91 s [0.85, 0.97], n = 127; interval straddles the line`."""
    return "; ".join([gate.value_text(), *gate.caveats()])


def write_junit(verdict: Verdict, path: Path) -> None:
    """FAIL -> <failure>, INVALID -> <error>, N/A -> <skipped> with the reason, MARGINAL ->
    passing case whose output says so."""
    failures = sum(g.status == Status.FAIL for g in verdict.gates)
    errors = sum(g.status == Status.INVALID for g in verdict.gates) + bool(verdict.run_problems)
    suite = ET.Element(
        "testsuite",
        name=SUITE,
        tests=str(len(verdict.gates) + 1),
        failures=str(failures),
        errors=str(errors),
        skipped=str(len(verdict.not_applicable)),
    )
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="verdict", value=str(verdict.status))
    ET.SubElement(props, "property", name="score", value=f"{verdict.score:g}")
    ET.SubElement(props, "property", name="run_dir", value=verdict.run_dir)
    validity = ET.SubElement(suite, "testcase", classname=SUITE, name="run_validity")
    if verdict.run_problems:
        ET.SubElement(validity, "error", message="run is INVALID", type="INVALID").text = "\n".join(
            verdict.run_problems
        )
    for gate in verdict.gates:
        case = ET.SubElement(suite, "testcase", classname=SUITE, name=gate.id)
        _properties(case, gate)
        headline = _headline(gate)
        text = "\n".join(
            [
                gate.title,
                f"{headline} (threshold {gate.threshold})",
                gate.message,
                *(str(e) for e in gate.evidence),
                *gate.notes,
            ]
        )
        message = f"{headline}: {gate.message}"
        if gate.status == Status.FAIL:
            ET.SubElement(case, "failure", message=message, type="FAIL").text = text
        elif gate.status == Status.INVALID:
            ET.SubElement(case, "error", message=message, type="INVALID").text = text
        elif gate.status == Status.NA:
            ET.SubElement(case, "skipped", message=gate.message)
        else:
            ET.SubElement(case, "system-out").text = f"{gate.status}: {text}"
    ET.indent(suite)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
