"""junit.xml and the console verdict lines: each gate's value with its interval and n, a flag
when the evidence cannot settle the gate (interval straddling the line, too few samples), a
MARGINAL gate that no CI viewer shows as passed, and what the evidence checks found."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from gates.cli import format_verdict
from gates.junit import EVIDENCE_SUITE, SUITE, write_junit
from gates.verdict import Status, Verdict
from tests.reports.verdicts import (
    CLOCKS,
    TWICE,
    oom_gate,
    straddling_ttft_gate,
    ttft_gate,
    verdict,
    with_evidence,
)


def straddling_verdict() -> Verdict:
    marginal = straddling_ttft_gate()
    failing = oom_gate(
        id="oom_fail", status=Status.FAIL, value=2.0, interval=[0.24, 7.2], method="exact"
    )
    return verdict(Status.FAIL, oom_gate(), marginal, failing)


def cases(path: Path, classname: str = SUITE) -> dict[str, ET.Element]:
    return {
        c.get("name", ""): c
        for c in ET.parse(path).getroot().iter("testcase")
        if c.get("classname") == classname
    }


def suite_properties(suite: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in suite.findall("properties/property")}


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


def test_a_marginal_gate_is_skipped_not_passed_and_says_so(tmp_path: Path) -> None:
    """Jenkins, GitLab and the GitHub reporters show a skipped case neither green nor red; only
    the exit code (4) decides the job. N/A is skipped too, and its message and status differ."""
    not_applicable = oom_gate(
        id="tenant_share_cap", status=Status.NA, message="N/A: the server has no tenants"
    )
    judged = verdict(Status.MARGINAL, oom_gate(), straddling_ttft_gate(), not_applicable)
    write_junit(judged, tmp_path / "junit.xml")
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    found = cases(tmp_path / "junit.xml")

    marginal = found["ttft_critical_p95"]
    skipped = marginal.find("skipped")
    assert skipped is not None, "a MARGINAL gate must not read as a passing case"
    assert skipped.get("message", "").startswith(
        "MARGINAL: p(95) = 0.86 s [0.79, 0.95], n = 127; interval straddles the line"
    )
    assert marginal.find("failure") is None and marginal.find("error") is None
    assert properties(marginal)["status"] == "MARGINAL"
    assert (marginal.findtext("system-out") or "").startswith("MARGINAL: ")

    na = found["tenant_share_cap"].find("skipped")
    assert na is not None and na.get("message") == "N/A: the server has no tenants"
    assert properties(found["tenant_share_cap"])["status"] == "N/A"
    assert found["no_oom"].find("skipped") is None

    assert suite.get("skipped") == "2" and suite.get("failures") == "0"
    assert suite.get("errors") == "0"
    top = suite_properties(suite)
    assert top["verdict"] == "MARGINAL"
    assert top["marginal"] == "1" and top["not_applicable"] == "1"


def test_each_evidence_check_is_a_case_of_its_own(tmp_path: Path) -> None:
    judged = with_evidence(verdict(Status.INVALID, oom_gate()), CLOCKS, TWICE)
    write_junit(judged, tmp_path / "junit.xml")
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    checks = cases(tmp_path / "junit.xml", EVIDENCE_SUITE)
    assert list(checks) == ["unique_request_ids", "clock_offset", "run_window"]

    clocks = checks["clock_offset"].find("error")
    assert clocks is not None and clocks.get("type") == "INVALID"
    assert clocks.get("message") == (
        "makes the run INVALID: clock_offset: client and server clocks disagree by 2.5 s, "
        "beyond the 0.5 s bound [server_events.t, rows 3, 7 (12 in all)]"
    )
    assert properties(checks["clock_offset"])["result"] == "invalid"

    twice = checks["unique_request_ids"]
    assert twice.find("error") is None and twice.find("failure") is None
    assert (twice.findtext("system-out") or "") == (
        "note: unique_request_ids: dropped 2 rows written twice [requests.request_id, rows 4, 9]"
    )
    assert properties(twice)["result"] == "note"

    window = checks["run_window"]
    assert list(window.iter("error")) == [] and properties(window)["result"] == "clean"
    assert properties(window)["description"] == "The run finished its planned window."

    # the gate, the run's validity and the three checks; errors: the run and clock_offset
    assert suite.get("tests") == "5" and suite.get("errors") == "2"
    validity = cases(tmp_path / "junit.xml")["run_validity"].find("error")
    assert validity is not None and "clock_offset: client and server" in (validity.text or "")
    top = suite_properties(suite)
    assert top["evidence_checks"] == (
        "3 ran, 1 clean; flagged: unique_request_ids (note), clock_offset (makes the run INVALID)"
    )


def test_console_says_what_the_evidence_checks_found() -> None:
    judged = with_evidence(verdict(Status.INVALID, oom_gate()), CLOCKS)
    lines = format_verdict(judged).splitlines()
    assert "  evidence checks: 3 ran, 2 clean; flagged: clock_offset (makes the run INVALID)" in (
        lines
    )
    assert f"  run: {CLOCKS.text()}" in lines
    clean = with_evidence(verdict(Status.PASS, oom_gate()))
    assert "  evidence checks: 3 ran, all clean" in format_verdict(clean).splitlines()
    assert not any(
        "evidence checks" in line for line in format_verdict(verdict(Status.PASS)).splitlines()
    )
