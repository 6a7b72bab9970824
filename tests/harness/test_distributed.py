"""A Locust worker process's lifetime: it quits, and says so, when it outlives its plan."""

from __future__ import annotations

import logging
from typing import Any

import gevent
import pytest
from gevent.pool import Group
from locust.env import Environment

from harness.distributed import run_worker
from harness.plan import Plan, plan_from_dict


class _StuckWorkerRunner:
    """A worker runner whose greenlets never finish: a worker the master forgot."""

    def __init__(self) -> None:
        self.greenlet = Group()
        self.greenlet.spawn(gevent.sleep, 60)
        self.quit_calls = 0

    def quit(self) -> None:
        self.quit_calls += 1
        self.greenlet.kill(block=True)

    def register_message(self, name: str, handler: Any) -> None:
        """A worker registers the replay's start message; nothing sends it here."""


def _plan() -> Plan:
    return plan_from_dict({"name": "t", "traffic": {"classes": {"batch": {}}}})


def test_a_worker_that_outlives_its_plan_quits_and_returns_1(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runner = _StuckWorkerRunner()

    def create_worker_runner(self: Environment, *args: Any, **kwargs: Any) -> _StuckWorkerRunner:
        return runner

    monkeypatch.setattr(Environment, "create_worker_runner", create_worker_runner)
    with caplog.at_level(logging.ERROR, logger="harness.distributed"):
        code = run_worker(_plan(), "127.0.0.1:5557", max_lifetime_s=0.05)
    assert code == 1
    assert runner.quit_calls == 1
    assert "worker outlived the plan" in caplog.text


def test_a_worker_whose_greenlets_end_returns_0(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _StuckWorkerRunner()
    runner.greenlet.kill(block=True)  # the run ended: nothing left in the group

    def create_worker_runner(self: Environment, *args: Any, **kwargs: Any) -> _StuckWorkerRunner:
        return runner

    monkeypatch.setattr(Environment, "create_worker_runner", create_worker_runner)
    assert run_worker(_plan(), "127.0.0.1:5557", max_lifetime_s=5) == 0
    assert runner.quit_calls == 0
