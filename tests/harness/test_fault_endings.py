"""How faults end with the load: a rollback under way is waited for, never cut off; one that
cannot finish is journaled as such, and the verdict sees it (gates/evaluator.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from gates import schema
from gates.rundir import read_jsonl
from harness.faults.base import FaultSpec
from harness.faults.registry import Fault
from harness.faults.scheduler import FaultScheduler
from harness.rundir import TableWriter
from tests.waiting import wait_until

ADAPTER: TypeAdapter[FaultSpec] = TypeAdapter(Fault)


def scheduler(tmp_path: Path, *faults: dict[str, Any]) -> FaultScheduler:
    specs = [ADAPTER.validate_python(f) for f in faults]
    return FaultScheduler(specs, None, TableWriter(tmp_path, schema.FAULTS), lambda _: 0)


def rows(tmp_path: Path) -> list[dict[str, Any]]:
    return read_jsonl(tmp_path / f"{schema.FAULTS}.jsonl").rows


def test_the_end_of_the_load_waits_for_a_restart_under_way(tmp_path: Path) -> None:
    """The load ends while the fault's rollback (a slow restart) runs: stop() waits for it,
    so the server is back, and the row says the rollback finished."""
    began, restarted = tmp_path / "began", tmp_path / "restarted"
    sched = scheduler(
        tmp_path,
        {
            "kind": "command",
            "at_s": 0,
            "command": "true",
            "rollback": f"touch {began}; sleep 1; touch {restarted}",
            "rollback_after_s": 0,
            "timeout_s": 60,
        },
    )
    sched.start(time.monotonic())
    wait_until(began.exists, what="the rollback to begin")
    sched.stop()
    assert restarted.exists(), "stop() returned before the rollback it interrupted finished"
    [row] = rows(tmp_path)
    assert row["outcome"] == "ok" and sched.unfinished_rollbacks == []


def test_the_end_of_the_load_ends_a_hold_and_runs_the_rollback_now(tmp_path: Path) -> None:
    rolled_back = tmp_path / "rolled-back"
    sched = scheduler(
        tmp_path,
        {
            "kind": "command",
            "at_s": 0,
            "command": "true",
            "rollback": f"touch {rolled_back}",
            "rollback_after_s": 3600,  # the hold: the end of the load cuts it short
        },
    )
    sched.start(time.monotonic())
    wait_until(lambda: sched.holding == 1, what="the fault to take effect")
    sched.stop()
    assert rolled_back.exists()
    [row] = rows(tmp_path)
    assert row["outcome"] == "ok" and row["t_end"] >= row["t_start"]


def test_a_rollback_that_fails_is_named_as_unfinished(tmp_path: Path) -> None:
    sched = scheduler(
        tmp_path,
        {"kind": "command", "at_s": 0, "command": "true", "rollback": "exit 7"},
    )
    sched.start(time.monotonic())
    wait_until(lambda: rows(tmp_path), what="the fault's row")
    sched.stop()
    [row] = rows(tmp_path)
    assert row["outcome"].startswith("failed: rollback")
    [unfinished] = sched.unfinished_rollbacks
    assert unfinished.startswith("command: rollback") and "7" in unfinished
