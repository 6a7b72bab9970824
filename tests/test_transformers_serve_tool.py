"""tools/transformers_serve.py without its install: what it says and does when nothing is set
up or running (its real use is tests/real/test_transformers_serve.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "transformers_serve.py"


def run(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"XDG_CACHE_HOME": str(cache), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_start_without_setup_says_what_to_run(tmp_path: Path) -> None:
    proc = run(tmp_path, "start")
    assert proc.returncode == 1
    assert "not set up at" in proc.stdout and "transformers_serve.py setup" in proc.stdout
    assert not (tmp_path / "kvgate" / "transformers-serve-5.24.0" / "server.pid").exists()


def test_status_and_stop_of_a_server_that_is_not_running(tmp_path: Path) -> None:
    status = run(tmp_path, "status")
    assert (status.returncode, status.stdout.strip()) == (1, "transformers serve: not running")
    stop = run(tmp_path, "stop")
    assert (stop.returncode, stop.stdout.strip()) == (0, "transformers serve: not running")


def test_a_stale_pid_file_is_not_a_running_server(tmp_path: Path) -> None:
    base = tmp_path / "kvgate" / "transformers-serve-5.24.0"
    base.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (base / "server.pid").write_text(f"{dead.pid}\n")
    assert run(tmp_path, "status").returncode == 1


@pytest.mark.parametrize("bad", [["serve"], ["start", "--port", "x"]])
def test_bad_arguments_are_usage_errors(tmp_path: Path, bad: list[str]) -> None:
    proc = run(tmp_path, *bad)
    assert proc.returncode == 2 and "usage:" in proc.stderr
