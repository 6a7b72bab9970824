"""Running a `kvgate` command as a person would, to see its exit code and what it printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kvgate(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`kvgate ARGS...` in a fresh interpreter, on this checkout's packages."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
