"""The sampler follows an external server's process through its pidfile and sees it die."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.samplers.process import ProcessSampler, read_pidfile


def test_a_watched_process_that_dies_is_recorded_once(tmp_path: Path) -> None:
    pidfile = tmp_path / "server.pid"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pidfile.write_text(f"{proc.pid}\n")

        def roles() -> dict[str, int]:
            pid = read_pidfile(str(pidfile))
            return {"server": pid} if pid else {}

        sampler = ProcessSampler(roles)
        alive = sampler.sample()
        assert {r["metric"] for r in alive} == {"process_cpu_percent", "process_rss_bytes"}
        proc.kill()
        proc.wait()
        died = [r for r in sampler.sample() if r["metric"] == "process_died"]
        assert len(died) == 1 and died[0]["labels"] == "role=server"
        assert died[0]["target"] == str(proc.pid)
        assert not [r for r in sampler.sample() if r["metric"] == "process_died"]  # once
    finally:
        proc.kill()
        proc.wait()
    pidfile.write_text("not a pid")
    assert read_pidfile(str(pidfile)) is None
