"""The HTML report in a real browser: headless Chromium via playwright."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from reports import write_reports

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install -y chromium)"
    ),
]


def test_report_renders_every_chart_without_console_errors(
    run_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    html = write_reports(run_copy("oom"))["html"]
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on(
                "request",
                lambda r: (
                    errors.append(f"network: {r.url}") if not r.url.startswith("file:") else None
                ),
            )
            page.goto(html.as_uri())
            figures = page.locator("figure[data-chart-id]")
            assert figures.count() == 11
            for i in range(figures.count()):
                figure = figures.nth(i)
                name = figure.get_attribute("data-chart-id")
                svg = figure.locator("svg.chart")
                assert svg.count() == 1, f"chart {name} has no SVG"
                box = svg.bounding_box()
                assert box is not None and box["width"] > 0 and box["height"] > 0, name
                marks = svg.locator(".mark")
                assert marks.count() > 0, f"chart {name} drew nothing"
                mark_box = marks.first.bounding_box()
                assert mark_box is not None and (mark_box["width"] > 0 or mark_box["height"] > 0), (
                    name
                )
            assert page.locator("#verdict").inner_text() == "FAIL"
            threshold = page.locator("#chart-critical_ttft line.threshold")
            assert threshold.count() == 1 and threshold.get_attribute("data-at") == "0.9"
            box = threshold.bounding_box()
            assert box is not None and box["width"] > 600, "the TTFT line spans the chart"
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert shot.stat().st_size > 10_000
