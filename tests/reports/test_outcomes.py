"""The outcome table, scrape failures and the server's token count in every summary."""

from __future__ import annotations

from pathlib import Path

from gates.rundir import load_run
from reports import write_reports
from reports.outcomes import outcome_table, scrape_problems, token_ratio
from tests.gates.builder import RunBuilder


def run_with_trouble() -> RunBuilder:
    b = RunBuilder()
    for i in range(60):
        b.request(f"ok{i}", prompt_tokens=1100, target_prompt_tokens=1000, ttft_s=0.1)
    for i in range(40):
        b.request(
            f"bad{i}", traffic_class="long_output", outcome="rejected", http_status=400,
            error_code="model_not_found", error_message="no model llama-3-8b",
        )  # fmt: skip
    for t in (1.0, 2.0):
        b.sample("scrape_error", 1.0, t, target="target", labels="error=HTTP 404")
    return b


def test_every_summary_says_how_requests_ended_and_what_telemetry_failed(
    tmp_path: Path,
) -> None:
    path = run_with_trouble().write(tmp_path / "run")
    run = load_run(path)
    columns, rows = outcome_table(run)
    assert columns == ["ok", "rejected"]
    by_class = {r.traffic_class: r for r in rows}
    assert by_class["long_output"].counts == {"rejected": 40}
    assert by_class["long_output"].top_errors[0][1] == 40
    assert "model_not_found" in by_class["long_output"].top_errors[0][0]
    assert by_class["all"].total == 100
    (problem,) = scrape_problems(run)
    assert (problem.target, problem.reason, problem.count) == ("target", "HTTP 404", 2)
    ratio = token_ratio(run)
    assert ratio is not None and ratio.overall == 1.1 and ratio.n == 60
    summary = write_reports(path)["markdown"].read_text()
    assert "### How requests ended" in summary and "40 × HTTP 400 rejected" in summary
    assert "### Telemetry that failed" in summary and "2 × HTTP 404" in summary
    assert "1.10x the tokens" in summary


def test_a_server_without_events_shows_its_own_counters(tmp_path: Path) -> None:
    b = RunBuilder()
    b.meta["target"] = {"kind": "vllm", "model": "m", "url": "http://127.0.0.1:9"}
    b.request("r", ttft_s=0.1)
    for t, value in ((1, 3.0), (50, 10.0), (110, 15.0)):
        b.sample("vllm:num_preemptions_total", value, t, target="target")
    summary = write_reports(b.write(tmp_path / "run"))["markdown"].read_text()
    assert "preemptions +12 (`vllm:num_preemptions_total`)" in summary


def test_a_report_written_while_the_run_goes_on_says_it_is_interim(tmp_path: Path) -> None:
    b = RunBuilder().request("r", ttft_s=0.1)
    final = write_reports(b.write(tmp_path / "done"))["markdown"].read_text()
    assert "Interim" not in final
    b.meta["status"] = "running"
    paths = write_reports(b.write(tmp_path / "running"))
    assert paths["markdown"].read_text().startswith("**Interim, at +")
    assert 'id="interim"' in paths["html"].read_text()
