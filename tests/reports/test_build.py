"""report.html, summary.md and report.json from run directories."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from gates.rundir import load_run
from reports import write_reports
from reports.analysis import gpu_memory
from reports.cli import main
from tests.gates.builder import RunBuilder, prefix_group


def test_failing_run_report_puts_verdict_and_failed_gates_first(
    run_copy: Callable[[str], Path],
) -> None:
    path = run_copy("oom")
    paths = write_reports(path)
    html = paths["html"].read_text()
    assert html.index('id="verdict"') < html.index('id="failed"') < html.index('id="charts"')
    assert ">FAIL<" in html and "no_oom" in html
    assert (path / "verdict.json").is_file()  # gates ran because no verdict existed
    summary = paths["markdown"].read_text()
    assert summary.startswith("## kvgate: **FAIL**")
    assert re.search(
        r"\| Zero OOM anywhere in the run \(idle, ramp, load or drain\) \| key \| FAIL "
        r"\| count = 2\b[^|]*, n = (\d+)[^|]* \| \1 \| `count == 0` \|",
        summary,
    )
    assert str(paths["html"]) in summary
    report = json.loads(paths["json"].read_text())
    assert report["verdict"]["status"] == "FAIL"
    assert report["data"]["tenant_share"]["cap"] == 0.15
    assert all(not chart["empty"] for chart in report["charts"].values())


def test_html_is_self_contained(run_copy: Callable[[str], Path]) -> None:
    html = write_reports(run_copy("clean"))["html"].read_text()
    assert "<script" not in html and "<link" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert html.count('<svg class="chart"') == 11


def test_charts_without_data_say_so(tmp_path: Path) -> None:
    path = RunBuilder().request("a", ttft_s=0.2).write(tmp_path / "run")
    paths = write_reports(path)
    html = paths["html"].read_text()
    report = json.loads(paths["json"].read_text())
    assert report["charts"]["ttft"]["empty"] is None
    assert "no cancelled request" in report["charts"]["cancel_release"]["empty"]
    assert "No data: the load shape did not search for capacity" in html
    assert html.count('data-empty="true"') == sum(
        1 for c in report["charts"].values() if c["empty"]
    )


def test_a_replayed_trace_is_said_under_the_verdict(run_copy: Callable[[str], Path]) -> None:
    path = run_copy("clean")
    plain = write_reports(path)
    assert "Replay:" not in plain["markdown"].read_text()
    assert 'id="replay"' not in plain["html"].read_text()
    meta = json.loads((path / "meta.json").read_text())
    meta["replay"] = {
        "scheduled": 12031,
        "sent": 12030,
        "unsent": 1,
        "stragglers": 2,
        "clipped": 254,
        "skipped": 0,
        "schedule_error_ms": {"p50": 3.15, "p99": 16.54, "max": 49.7},
        "schedule_error_bound_ms": 25.0,
        "prefix_reuse_server": 0.1602,
        "prefix_reuse_trace": 0.3777,
        "load_generator_cpu_cores_mean": 0.204,
        "load_generator_cpu_cores_max": 0.441,
    }
    (path / "meta.json").write_text(json.dumps(meta))
    said = (
        "Replay: 12030 of 12031 requests sent (1 unsent, 2 still running at the end), 254 "
        "clipped, 0 skipped; schedule error p50 3.1 ms, p99 16.5 ms, max 50 ms (bound 25 ms "
        "at p99); prefix reuse server/trace 16.0% / 37.8%; load generator 0.20 cores on "
        "average, 0.44 at most."
    )
    paths = write_reports(path)
    summary = paths["markdown"].read_text()
    assert said in summary
    assert summary.index(said) < summary.index("| gate | key | status |")
    html = paths["html"].read_text()
    assert f'<p class="value" id="replay">{said}</p>' in html


def test_existing_verdict_is_reused(run_copy: Callable[[str], Path]) -> None:
    path = run_copy("clean")
    assert main([str(path)]) == 0
    verdict = json.loads((path / "verdict.json").read_text())
    verdict["status"] = "MARGINAL"
    (path / "verdict.json").write_text(json.dumps(verdict))
    assert main([str(path)]) == 0
    assert "**MARGINAL**" in (path / "summary.md").read_text()


def test_report_cli_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_chart_the_data_defeats_does_not_cost_the_report(
    run_copy: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from reports import build, figures

    def broken(run: object) -> figures.Figure:
        raise ValueError("bad column")

    monkeypatch.setattr(build, "FIGURES", (broken, *figures.FIGURES[1:]))
    paths = write_reports(run_copy("clean"))
    report = json.loads(paths["json"].read_text())
    assert "could not be drawn (ValueError: bad column)" in report["charts"]["broken"]["empty"]
    assert report["charts"]["ttft"]["empty"] is None


@pytest.mark.parametrize(
    ("source", "label"), [("nvml", "NVML"), ("sim_gpu", "simulated GPU, sampled as DCGM fields")]
)
def test_gpu_memory_says_where_its_numbers_come_from(
    tmp_path: Path, source: str, label: str
) -> None:
    """Without a GPU the sampler stores the virtual GPU under DCGM names; the chart must not
    call those numbers NVML."""
    b = RunBuilder()
    for t in (1, 2, 3):
        b.sample("DCGM_FI_DEV_FB_USED", 20480, t, source=source)
    b.sample("DCGM_FI_DEV_FB_TOTAL", 81920, 1, source=source)
    series, cap, named = gpu_memory(load_run(b.write(tmp_path / "run")))
    assert named == label
    assert cap == 80.0 and series["value"].max() == 20.0


def test_the_ttft_side_channel_is_a_line_of_the_report_when_probes_ran(tmp_path: Path) -> None:
    builder = RunBuilder()
    for g in range(12):
        prefix_group(builder, g, ttft=(0.25, 0.29))
    paths = write_reports(builder.write(tmp_path / "probed"))
    line = "median -40.0 ms [-40.0, -40.0] (95%), n = 12 pairs: the probe is faster"
    html = paths["html"].read_text()
    assert 'id="side-channel" data-visible="true"' in html and line in html
    assert line in paths["markdown"].read_text()
    assert json.loads(paths["json"].read_text())["side_channel"]["pairs"] == 12

    plain = write_reports(RunBuilder().request("a", ttft_s=0.2).write(tmp_path / "plain"))
    assert 'id="side-channel"' not in plain["html"].read_text()
    assert "side channel" not in plain["markdown"].read_text()
    assert json.loads(plain["json"].read_text())["side_channel"] is None
