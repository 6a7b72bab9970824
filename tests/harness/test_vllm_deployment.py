"""The managed engine's life cycle, on a stand-in with vLLM's process tree (an API server
whose engine core and worker outlive its SIGKILL): started and healthy, killed and restarted
as a whole tree by the kill fault, and nothing of it left after the run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from harness.engines import vllm_deployment
from harness.engines.vllm import VllmLaunch
from harness.engines.vllm_deployment import VllmDeployment
from harness.faults.base import FaultContext, FaultRecord
from harness.faults.kinds.replica import KillAction, KillFault, PauseAction, PauseFault
from harness.plan import VllmTarget
from tests.waiting import wait_until

FAKE = Path(__file__).with_name("data") / "fake_engine.py"


def pids_in(tree: Path) -> list[int]:
    return [int(line) for line in tree.read_text().split()] if tree.exists() else []


def running(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture
def engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[VllmDeployment, Path]]:
    tree = tmp_path / "engine.tree"

    def fake_launch(spec: VllmTarget, port: int, server_dir: Path) -> VllmLaunch:
        server_dir.mkdir(parents=True, exist_ok=True)
        return VllmLaunch(
            argv=(sys.executable, str(FAKE), str(port)),
            env={"FAKE_ENGINE_TREE": str(tree)},
            events_path=None,
            log_path=server_dir / "vllm.log",
            pidfile=server_dir / "vllm.pid",
        )

    monkeypatch.setattr(vllm_deployment, "launch", fake_launch)
    said: list[str] = []
    dep = VllmDeployment(VllmTarget(startup_timeout_s=60), tmp_path / "run", said.append)
    try:
        yield dep, tree
    finally:
        dep.stop()
    assert running(pids_in(tree)) == [], "a process of the engine outlived the run"


def test_start_waits_for_health_and_writes_the_pidfile(engine: tuple[VllmDeployment, Path]) -> None:
    dep, tree = engine
    url = dep.start()
    assert url == dep.spec.url and url.startswith("http://127.0.0.1:") and not url.endswith(":0")
    assert (
        dep.launch is not None and int(dep.launch.pidfile.read_text()) == dep.replica("vllm")["pid"]
    )
    wait_until(lambda: len(pids_in(tree)) == 3, what="the engine's three processes")
    assert dep.replica("vllm")["state"] == "running"


def test_a_kill_takes_the_whole_tree_and_the_restart_brings_it_back(
    engine: tuple[VllmDeployment, Path],
) -> None:
    dep, tree = engine
    dep.start()
    first = wait_until(lambda: pids_in(tree) if len(pids_in(tree)) == 3 else None, what="3 pids")
    kill = KillAction(KillFault(at_s=0, replica="vllm", restart_after_s=0), context(dep))
    record = FaultRecord("k", "kill", "vllm", {})
    kill.apply(record)
    assert sorted(record.params["pids"]) == sorted(first)  # the tree, not only the parent
    wait_until(lambda: not running(first), what="every process of the killed engine to be gone")
    kill.rollback(record)
    assert record.rollback and record.rollback[0].startswith("restarted")
    state = dep.replica("vllm")
    assert state["state"] == "running" and state["pid"] not in first and state["restarts"] == 1


def test_an_engine_core_orphaned_by_a_parent_only_kill_is_cleaned_up(
    engine: tuple[VllmDeployment, Path],
) -> None:
    """A SIGKILL from outside (say, the kernel's OOM killer) takes only the API server: its
    death is noticed, and the rest of its tree does not outlive it."""
    dep, tree = engine
    dep.start()
    first = wait_until(lambda: pids_in(tree) if len(pids_in(tree)) == 3 else None, what="3 pids")
    assert dep.proc is not None
    psutil.Process(dep.proc.pid).kill()
    dep.wait_dead("vllm")
    assert dep.replica("vllm")["state"] == "dead"
    wait_until(lambda: not running(first), what="the orphaned engine core and worker to go")


def test_a_pause_stops_and_resumes_every_process(engine: tuple[VllmDeployment, Path]) -> None:
    dep, tree = engine
    dep.start()
    first = wait_until(lambda: pids_in(tree) if len(pids_in(tree)) == 3 else None, what="3 pids")
    pause = PauseAction(PauseFault(at_s=0, replica="vllm", duration_s=1), context(dep))
    record = FaultRecord("p", "pause", "vllm", {})
    pause.apply(record)

    def states() -> set[str]:
        return {psutil.Process(p).status() for p in first}

    wait_until(lambda: states() == {psutil.STATUS_STOPPED}, what="all three to stop")
    pause.rollback(record)
    wait_until(lambda: psutil.STATUS_STOPPED not in states(), what="all three to resume")


def context(dep: VllmDeployment) -> FaultContext:
    return FaultContext(recent_cancels=lambda _s: 0, admin=dep)
