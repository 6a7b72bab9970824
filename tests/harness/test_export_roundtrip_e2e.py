"""A trace replayed, exported and replayed again: the same schedule, lengths and prefix
structure each time (kvgate run with `traffic.trace`, then kvgate export, on loopback)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from contract.trace import Trace, TraceRequest, read_trace, write_mooncake
from reports.export.cli import main as export

pytest.importorskip("workloads.sources.trace", reason="needs the trace replay (traffic.trace)")

ROOT = Path(__file__).resolve().parents[2]
PLAN = """
name: roundtrip
seed: 3
target: {{type: reference, replicas: 1}}
load: {{idle_before_s: 1, idle_after_s: 1}}
traffic:
  trace:
    path: {trace}
    drain_s: 10
    rules:
      - {{traffic_class: short_qa, priority: interactive, tenant: acme}}
faults: []
"""


def small_trace(path: Path) -> Path:
    """Thirty requests over about four seconds, some arriving together, most sharing one of
    two prefixes, each with blocks of its own after it."""
    rng = random.Random(5)
    requests, fresh, t = [], 3, 0.0
    for _ in range(30):
        own = rng.randint(0, 2)
        ids = (*rng.choice([(0, 1), (2,)]), *range(fresh, fresh + own))
        fresh += own
        t += rng.choice([0.0, 0.1, 0.25])
        tokens = (len(ids) - 1) * 512 + rng.randint(1, 512)
        requests.append(TraceRequest(round(t, 3), tokens, rng.randint(4, 16), ids))
    # no two requests of one instant alike in size, so `canonical` orders them one way only
    assert len({(r.t_s, r.input_tokens, r.output_tokens) for r in requests}) == len(requests)
    with path.open("w") as out:
        write_mooncake(requests, out)
    return path


def replay_and_export(trace: Path, work: Path) -> Path:
    """Replays `trace` against the reference server and exports the run as a trace."""
    plan = work / f"{trace.stem}.plan.yaml"
    plan.write_text(PLAN.format(trace=trace))
    run_dir = work / f"{trace.stem}.run"
    cmd = [sys.executable, "-m", "harness.run_cmd", str(plan), "--out", str(run_dir), "--no-gates"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    exported = work / f"{trace.stem}.export.jsonl"
    assert export([str(run_dir), "--format", "mooncake", "--out", str(exported)]) == 0
    return exported


def canonical(trace: Trace) -> list[tuple[float, int, int, tuple[int, ...]]]:
    """The requests by time, and within one instant by size (a trace gives the requests of
    one instant no order: they arrive together), block ids renamed by first appearance."""
    names: dict[int, int] = {}
    ordered = sorted(trace.requests, key=lambda r: (r.t_s, r.input_tokens, r.output_tokens))
    return [
        (
            r.t_s,
            r.input_tokens,
            r.output_tokens,
            tuple(names.setdefault(h, len(names)) for h in r.hash_ids),
        )
        for r in ordered
    ]


@pytest.mark.e2e
def test_a_replays_export_replays_to_the_same_schedule_lengths_and_prefixes(
    tmp_path: Path,
) -> None:
    original = small_trace(tmp_path / "original.jsonl")
    first = replay_and_export(original, tmp_path)
    second = replay_and_export(first, tmp_path)
    expected = canonical(read_trace(original))
    assert canonical(read_trace(first)) == expected
    assert canonical(read_trace(second)) == expected
