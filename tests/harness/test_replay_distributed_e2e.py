"""A replay split across Locust workers on separate hosts: two workers, each in a network
namespace of its own (its own addresses and loopback, reached over a veth pair from the
master's), send their shares of one trace to one server; every request of the trace goes
out exactly once, at its own time, and every record reaches the master.

The namespaces stand for hosts on this machine: addresses in 198.18.0.0/15 (set aside for
benchmarks), nothing routed beyond it. The test creates two and deletes them, whatever
happens; without the right to create them (`ip netns`: root, or CAP_NET_ADMIN) it skips
and says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.trace import TraceRequest, read_trace, write_mooncake
from gates.rundir import load_run
from reports.export.cli import main as export
from tests.server.procs import start_deployment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
REQUESTS = 60
PLAN = """
name: netns-replay
seed: 5
target: {{type: external, url: "{url}", kind: openai, api_key: kvg-acme-key, model: llama-3-8b}}
load: {{idle_before_s: 1, idle_after_s: 1, stop_if_failing: null}}
traffic:
  trace:
    path: {trace}
    drain_s: 8
    rules: [{{tenant: acme}}]
samplers: {{release_probe: {{count: 0}}}}
faults: []
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def namespaces(count: int) -> Iterator[list[tuple[str, str, str]]]:
    """`count` namespaces, each with a veth pair to this one: (name, the master's address
    on its pair, its own address). Deleted on the way out (their veths go with them)."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command: the namespaces cannot be made")
    tag = f"kvgr{os.getpid() % 100000}"
    made: list[tuple[str, str, str]] = []
    try:
        for i in range(count):
            name, outer, inner = f"{tag}-{i}", f"{tag}o{i}", f"{tag}i{i}"
            try:
                _ip("netns", "add", name)
            except subprocess.CalledProcessError as exc:
                pytest.skip(f"`ip netns add` is not permitted here: {exc.stderr.decode().strip()}")
            master, own = f"198.18.{i}.1", f"198.18.{i}.2"
            made.append((name, master, own))
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", name)
            _ip("addr", "add", f"{master}/24", "dev", outer)
            _ip("link", "set", outer, "up")
            for args in (
                ("addr", "add", f"{own}/24", "dev", inner),
                ("link", "set", inner, "up"),
                ("link", "set", "lo", "up"),
                ("route", "add", "default", "via", master),
            ):
                _ip("netns", "exec", name, "ip", *args)
        yield made
    finally:
        for name, _, _ in made:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=10)


def small_trace(path: Path) -> Path:
    """REQUESTS requests over three seconds, two at each instant, sharing prefixes."""
    with path.open("w") as out:
        write_mooncake(
            (
                TraceRequest((i // 2) / 10, 1025 + i, 4, (0, 1 + i % 7, 100 + i))
                for i in range(REQUESTS)
            ),
            out,
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def test_workers_on_separate_hosts_send_every_request_once_and_lose_no_record(
    tmp_path: Path,
) -> None:
    with namespaces(WORKERS) as hosts:
        server = start_deployment(tmp_path / "server", "--host", "0.0.0.0", replicas=1)
        try:
            port = int(server.url.rsplit(":", 1)[1])
            _, first_master, _ = hosts[0]
            trace = small_trace(tmp_path / "trace.jsonl")
            plan = tmp_path / "plan.yaml"
            plan.write_text(PLAN.format(url=f"http://{first_master}:{port}", trace=trace))
            run_dir = tmp_path / "run"
            master_port = free_port()
            python = [sys.executable, "-m", "harness.run_cmd", str(plan)]
            bind = ["--master-bind", f"0.0.0.0:{master_port}", "--expect-workers", str(WORKERS)]
            master = subprocess.Popen(
                [*python, "--out", str(run_dir), "--no-gates", *bind],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            workers = [
                subprocess.Popen(
                    [
                        "ip",
                        "netns",
                        "exec",
                        name,
                        *python,
                        "--worker",
                        "--master",
                        f"{address}:{master_port}",
                    ],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
                for name, address, _ in hosts
            ]
            try:
                out, _ = master.communicate(timeout=200)
                assert master.returncode == 0, out.decode(errors="replace")[-3000:]
                for worker in workers:
                    worker.wait(timeout=60)
            finally:
                for proc in (master, *workers):
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait(timeout=10)
        finally:
            server.stop()

    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["load_generator"]["mode"] == "distributed"
    relay = meta["records"]["relay"]
    assert len(relay["sent"]) == WORKERS and set(relay["lost"].values()) == {0}
    replay = meta["replay"]
    assert (replay["scheduled"], replay["sent"], replay["unsent"]) == (REQUESTS, REQUESTS, 0)

    requests = load_run(run_dir).requests
    replayed = requests[requests["t_scheduled"].notna()]
    assert len(replayed) == REQUESTS and replayed["request_id"].is_unique
    assert replayed["worker"].nunique() == WORKERS  # each worker sent its share
    assert replayed["outcome"].eq("ok").all()

    exported = tmp_path / "export.jsonl"
    assert export([str(run_dir), "--format", "mooncake", "--out", str(exported)]) == 0
    sent = sorted((r.t_s, r.input_tokens) for r in read_trace(exported).requests)
    planned = sorted((r.t_s, r.input_tokens) for r in read_trace(trace).requests)
    assert sent == planned  # one schedule, split across hosts, sent whole
