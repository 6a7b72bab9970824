"""summary.md and report.html say what the evidence checks found before any gate: each check
clean, or its findings with the rows they name."""

from __future__ import annotations

import re
from pathlib import Path

from gates.verdict import Status
from reports import write_reports
from tests.gates.builder import RunBuilder
from tests.gates.toy_check import NAME as TOY_CHECK
from tests.gates.toy_check import ghost_builder, registered
from tests.reports.verdicts import CLOCKS, TWICE, oom_gate, verdict, with_evidence


def small_run(path: Path) -> Path:
    return RunBuilder().request("a", ttft_s=0.2).write(path)


def test_flagged_checks_show_their_findings_and_rows(tmp_path: Path) -> None:
    judged = with_evidence(verdict(Status.INVALID, oom_gate()), CLOCKS, TWICE)
    paths = write_reports(small_run(tmp_path / "run"), verdict=judged)
    summary = paths["markdown"].read_text()
    section = summary[summary.index("### Evidence checks") :]
    assert "3 ran before the gates, 2 flagged (rows count from 0 in each table as read)." in section
    assert (
        "**`clock_offset`** makes the run INVALID "
        "(Client and server clocks agree within a bound.):\n"
        "- INVALID: client and server clocks disagree by 2.5 s, beyond the 0.5 s bound "
        "[server_events.t, rows 3, 7 (12 in all)]"
    ) in section
    assert (
        "**`unique_request_ids`** note (Each request id appears once in the requests table.):\n"
        "- note: dropped 2 rows written twice [requests.request_id, rows 4, 9]"
    ) in section
    assert "Clean: `run_window`." in section

    html = paths["html"].read_text()
    assert '<section id="evidence">' in html
    assert "before any gate judged them; 1 clean. Rows count from 0" in html
    rows = dict(re.findall(r'<tr data-check="([a-z_]+)" data-result="([a-z]+)">', html))
    assert rows == {"unique_request_ids": "note", "clock_offset": "invalid", "run_window": "clean"}
    clocks = html[html.index('data-check="clock_offset"') : html.index('data-check="run_window"')]
    assert "client and server clocks disagree by 2.5 s" in clocks
    assert '<div class="evidence">server_events.t, rows 3, 7 (12 in all)</div>' in clocks


def test_clean_evidence_is_one_line_and_an_older_verdict_shows_none(tmp_path: Path) -> None:
    judged = with_evidence(verdict(Status.PASS, oom_gate()))
    paths = write_reports(small_run(tmp_path / "run"), verdict=judged)
    summary = paths["markdown"].read_text()
    assert (
        "### Evidence checks\n\n3 ran before the gates, all clean: "
        "`unique_request_ids`, `clock_offset`, `run_window`.\n"
    ) in summary
    assert "Clean:" not in summary
    html = paths["html"].read_text()
    assert html.count('data-result="clean"') == 3
    assert "3 checks ran over the records before any gate judged them; all clean." in html

    old = write_reports(small_run(tmp_path / "old"), verdict=verdict(Status.PASS, oom_gate()))
    assert "Evidence checks" not in old["markdown"].read_text()
    assert 'id="evidence"' not in old["html"].read_text()


def test_a_registered_check_reaches_the_report_of_a_judged_run(tmp_path: Path) -> None:
    path = ghost_builder().write(tmp_path / "run")
    with registered("note"):
        paths = write_reports(path)  # no verdict yet: the gates run, the evidence first
    summary = paths["markdown"].read_text()
    assert (
        "- note: 2 request(s) of tenant ghost, which no plan defines [requests.tenant, rows 1, 3]"
    ) in summary
    assert f"**`{TOY_CHECK}`** note (Every request belongs to a tenant of the plan.):" in summary
    assert f'<tr data-check="{TOY_CHECK}" data-result="note">' in paths["html"].read_text()
