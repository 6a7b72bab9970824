"""`kvgate run --web`: the live page in headless Chromium, its charts update, stop ends the run
with a verdict."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.reports.test_browser import ARGS, CHROMIUM
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install -y chromium)"
    ),
]


def follow(proc: subprocess.Popen[str]) -> list[str]:
    """The process's output lines, read in the background as they come."""
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def live_page_port(lines: list[str], proc: subprocess.Popen[str]) -> int:
    """The port the OS gave the live page (`--web 127.0.0.1:0`), from the line announcing it."""

    def announced() -> int | None:
        assert proc.poll() is None, "the run ended before its page was served"
        found = [m for line in lines if (m := re.search(r"live page at http://[^:]+:(\d+)/", line))]
        return int(found[0].group(1)) if found else None

    return wait_until(announced, timeout_s=120, what="the live page's address on the console")


def wait_served(url: str, proc: subprocess.Popen[str], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before its page was served"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} was not served within {timeout_s:g} s")


def test_the_live_page_updates_and_stops_the_run_with_a_verdict(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    run_dir = tmp_path / "web"
    cmd = [sys.executable, "-m", "harness.cli", "run", str(ROOT / "harness/plans/smoke.yaml")]
    cmd += ["--out", str(run_dir), "--web", "127.0.0.1:0", "--set", "load.duration_s=120"]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = follow(proc)
    try:
        port = live_page_port(lines, proc)
        wait_served(f"http://127.0.0.1:{port}/kvgate/state.json", proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1100, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"http://127.0.0.1:{port}/kvgate")
                page.wait_for_function(
                    "Number(document.body.dataset.updates || 0) >= 3", timeout=60000
                )
                page.wait_for_function(
                    "Number(document.getElementById('ttft_p95').dataset.points || 0) > 0",
                    timeout=60000,
                )
                page.wait_for_selector("#gates tbody tr", timeout=60000)  # first running check
                assert page.locator("figure[data-chart]").count() == 4
                page.click("#stop")
                page.wait_for_function(
                    "document.getElementById('elapsed').textContent.includes('stopped')",
                    timeout=30000,
                )
                assert not errors, errors
            finally:
                browser.close()
        proc.wait(timeout=180)
        out = "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["load_generator"]["stopped_early"] == "stopped from the web page", out[-2000:]
    assert meta["windows"]["stress"][1] - meta["windows"]["stress"][0] < 120  # stopped early
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["status"] in ("PASS", "MARGINAL", "FAIL", "INVALID")
    assert (run_dir / "report.html").is_file()
