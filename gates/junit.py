"""JUnit XML for CI: one test case per gate, one for the run's validity, and one per evidence
check that ran before the gates.

Each gate's case carries its value as `GateResult.value_text()` (statistic, interval, n) in
the failure/error/skipped message or system-out, and per-case properties with its status, the
interval, its confidence and method, and the caveats (an interval straddling the line, the
samples a conclusive judgement needs), so a CI page shows how sure the verdict is without
verdict.json.

A MARGINAL gate is a skipped case whose message starts "MARGINAL: ": every common JUnit
viewer shows a skipped case as neither passed nor failed (yellow or grey), while only the exit
code decides whether the job fails, as the CI's own policy for exit 4 says. An N/A gate is
skipped too, its message starting "N/A: "; the case's `status` property tells the two apart
for a machine (gates/README.md, "junit.xml").
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

from gates.evidence.base import Effect
from gates.evidence.kept import CheckSeen, checks_seen, tally
from gates.verdict import GateResult, Status, Verdict

SUITE = "kvgate.gates"
EVIDENCE_SUITE = "kvgate.evidence"


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


def _gate_case(suite: ET.Element, gate: GateResult) -> None:
    """FAIL -> <failure>, INVALID -> <error>, MARGINAL -> <skipped "MARGINAL: ..."> with its
    output, N/A -> <skipped "N/A: ..."> with the reason, PASS -> a passing case with its output."""
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
        ET.SubElement(case, "skipped", message=gate.message)  # "N/A: why" (evaluator.judge)
    elif gate.status == Status.MARGINAL:
        ET.SubElement(case, "skipped", message=f"MARGINAL: {message}").text = text
        ET.SubElement(case, "system-out").text = f"{gate.status}: {text}"
    else:
        ET.SubElement(case, "system-out").text = f"{gate.status}: {text}"


def _evidence_case(suite: ET.Element, check: CheckSeen) -> None:
    """A check whose findings make the run INVALID -> <error type="INVALID"> naming each
    finding and its rows; a check with notes only passes, its notes in system-out; a clean
    check passes. (A check that refused the input left no verdict to write.)"""
    case = ET.SubElement(suite, "testcase", classname=EVIDENCE_SUITE, name=check.name)
    props = ET.SubElement(case, "properties")
    items = [
        ("result", "clean" if check.effect is None else str(check.effect)),
        ("description", check.description),
        ("findings", str(len(check.findings))),
    ]
    for name, value in items:
        ET.SubElement(props, "property", name=name, value=value)
    lines = "\n".join(f"{f.effect}: {f.text()}" for f in check.findings)
    if check.effect in (Effect.INVALID, Effect.REFUSE):
        bad = [f for f in check.findings if f.effect == check.effect]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        message = f"{check.result()}: {bad[0].text()}{more}"
        kind = str(check.effect).upper()
        ET.SubElement(case, "error", message=message, type=kind).text = lines
    elif check.findings:
        ET.SubElement(case, "system-out").text = lines
    else:
        ET.SubElement(case, "system-out").text = f"clean: {check.description or check.name}"


def write_junit(verdict: Verdict, path: Path) -> None:
    """The suite: its properties (verdict, score, run_dir, how many gates are MARGINAL and how
    many N/A, the evidence in one phrase), the run's validity, each evidence check, each gate."""
    checks = checks_seen(verdict.evidence)
    marginal = sum(g.status == Status.MARGINAL for g in verdict.gates)
    failures = sum(g.status == Status.FAIL for g in verdict.gates)
    errors = sum(g.status == Status.INVALID for g in verdict.gates) + bool(verdict.run_problems)
    errors += sum(c.effect in (Effect.INVALID, Effect.REFUSE) for c in checks)
    suite = ET.Element(
        "testsuite",
        name=SUITE,
        tests=str(len(verdict.gates) + 1 + len(checks)),
        failures=str(failures),
        errors=str(errors),
        skipped=str(len(verdict.not_applicable) + marginal),
    )
    props = ET.SubElement(suite, "properties")
    items = [
        ("verdict", str(verdict.status)),
        ("score", f"{verdict.score:g}"),
        ("run_dir", verdict.run_dir),
        ("marginal", str(marginal)),
        ("not_applicable", str(len(verdict.not_applicable))),
    ]
    if verdict.evidence:
        items.append(("evidence_checks", tally(checks)))
    for name, value in items:
        ET.SubElement(props, "property", name=name, value=value)
    validity = ET.SubElement(suite, "testcase", classname=SUITE, name="run_validity")
    if verdict.run_problems:
        ET.SubElement(validity, "error", message="run is INVALID", type="INVALID").text = "\n".join(
            verdict.run_problems
        )
    for check in checks:
        _evidence_case(suite, check)
    for gate in verdict.gates:
        _gate_case(suite, gate)
    ET.indent(suite)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
