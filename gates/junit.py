"""JUnit XML for CI: one test case per gate, plus one for the run's validity."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from gates.verdict import Status, Verdict

SUITE = "kvgate.gates"


def write_junit(verdict: Verdict, path: Path) -> None:
    """FAIL -> <failure>, INVALID -> <error>, MARGINAL -> passing case whose output says so."""
    failures = sum(g.status == Status.FAIL for g in verdict.gates)
    errors = sum(g.status == Status.INVALID for g in verdict.gates) + bool(verdict.run_problems)
    suite = ET.Element(
        "testsuite",
        name=SUITE,
        tests=str(len(verdict.gates) + 1),
        failures=str(failures),
        errors=str(errors),
        skipped="0",
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
        text = "\n".join([gate.title, gate.message, *(str(e) for e in gate.evidence), *gate.notes])
        if gate.status == Status.FAIL:
            ET.SubElement(case, "failure", message=gate.message, type="FAIL").text = text
        elif gate.status == Status.INVALID:
            ET.SubElement(case, "error", message=gate.message, type="INVALID").text = text
        else:
            ET.SubElement(case, "system-out").text = f"{gate.status}: {text}"
    ET.indent(suite)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
