"""junit.xml and the console verdict lines: each gate's value with its interval and n, and a
flag when the evidence cannot settle the gate (interval straddling the line, too few samples)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from gates.cli import format_verdict
from gates.junit import write_junit
from gates.verdict import Status, Verdict
from tests.reports.verdicts import oom_gate, straddling_ttft_gate, ttft_gate, verdict


def straddling_verdict() -> Verdict:
    marginal = straddling_ttft_gate()
    failing = oom_gate(
        id="oom_fail", status=Status.FAIL, value=2.0, interval=[0.24, 7.2], method="exact"
    )
    return verdict(Status.FAIL, oom_gate(), marginal, failing)


def cases(path: Path) -> dict[str, ET.Element]:
    return {c.get("name", ""): c for c in ET.parse(path).getroot().iter("testcase")}


def properties(case: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in case.iter("property")}


def test_junit_cases_carry_value_text_and_the_straddle_flag(tmp_path: Path) -> None:
    judged = straddling_verdict()
    write_junit(judged, tmp_path / "junit.xml")
    found = cases(tmp_path / "junit.xml")

    props = properties(found["ttft_critical_p95"])
    assert props["value"] == "p(95) = 0.86 s [0.79, 0.95], n = 127"
    assert props["interval"] == "[0.79, 0.95]" and props["confidence"] == "0.95"
    assert props["method"] == "order statistics" and props["n"] == "127"
    assert props["straddles"] == "true" and props["needs_n"] == "480"
    out = found["ttft_critical_p95"].findtext("system-out") or ""
    assert out.startswith("MARGINAL: ")
    assert (
        "p(95) = 0.86 s [0.79, 0.95], n = 127; interval straddles the line; "
        "needs >= 480 samples (threshold p(95) <= 900ms)"
    ) in out

    failure = found["oom_fail"].find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith("count = 2 [0.24, 7.2], n = 40: ")
    assert properties(found["oom_fail"])["straddles"] == "false"

    passing = properties(found["no_oom"])
    assert passing["value"] == "count = 0, n = 40" and passing["straddles"] == "false"
    assert "needs_n" not in passing and "interval" not in passing


def test_junit_writes_an_unbounded_interval_end_as_inf(tmp_path: Path) -> None:
    censored = ttft_gate(
        status=Status.FAIL, value=float("inf"), interval=[0.8, float("inf")], censored=9
    )
    write_junit(verdict(Status.FAIL, censored), tmp_path / "junit.xml")
    case = cases(tmp_path / "junit.xml")["ttft_critical_p95"]
    assert properties(case)["interval"] == "[0.8, inf]"
    assert properties(case)["censored"] == "9"
    failure = case.find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith("p(95) = inf s [0.8, inf], n = 127 (9 censored)")


def test_console_lines_show_value_text_threshold_and_caveats() -> None:
    judged = straddling_verdict()
    marginal = judged.gates[1]
    text = format_verdict(judged)
    lines = text.splitlines()
    assert lines[0].startswith("verdict: FAIL")
    ttft_line = next(line for line in lines if "ttft_critical_p95" in line)
    assert ttft_line == (
        "  MARGINAL ttft_critical_p95 [key]: p(95) = 0.86 s [0.79, 0.95], n = 127 "
        "(threshold p(95) <= 900ms); interval straddles the line; needs >= 480 samples"
    )
    assert "           " + marginal.message in lines
    assert "  PASS     no_oom [key]: count = 0, n = 40 (threshold count == 0)" in lines
    # `kvgate run` prints its own verdict line, then the gate lines.
    assert format_verdict(judged, header=False).splitlines() == lines[1:]
