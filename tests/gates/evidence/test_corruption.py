"""A healthy run directory, corrupted in each way an untrustworthy record can be, is never
judged PASS: the evidence checks refuse it, make it INVALID, or correct it so that the
gates see the failure it hides.

The healthy run is synthetic (reports/synthetic.py, `clean`: it PASSes every built-in gate);
Hypothesis picks the corruption and its size, and the test asserts the one property that
matters to a release manager: no corruption reads PASS.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract import EventKind, Outcome
from gates import schema
from gates.evaluator import evaluate
from gates.rundir import RunDirError, load_run
from gates.spec import load_gate_file
from gates.verdict import Status
from reports.synthetic import make_run

REFUSED = "refused"
Tables = dict[str, pd.DataFrame]


@dataclass(frozen=True)
class Run:
    """A run directory's tables and meta.json, as plain frames to corrupt."""

    tables: Tables
    meta: dict[str, Any]

    @classmethod
    def read(cls, path: Path) -> Run:
        tables = {name: pd.read_parquet(path / f"{name}.parquet") for name in schema.TABLES}
        return cls(tables, json.loads((path / schema.META_FILE).read_text()))

    def write(self, path: Path) -> Path:
        path.mkdir(parents=True)
        for name, frame in self.tables.items():
            frame.reset_index(drop=True).to_parquet(path / f"{name}.parquet", index=False)
        (path / schema.META_FILE).write_text(json.dumps(self.meta))
        return path


def judged(path: Path) -> str:
    """The verdict's status, or REFUSED when the input was refused (exit 2)."""
    try:
        return str(evaluate(load_run(path), load_gate_file(None)).status)
    except RunDirError:
        return REFUSED


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Run:
    path = make_run(tmp_path_factory.mktemp("healthy") / "run", 4000, 4000)
    run = Run.read(path)
    # what compaction records: the rows each table had when the run ended
    run.meta["tables"] = {name: len(frame) for name, frame in run.tables.items()}
    return run


def copy(run: Run) -> Run:
    return Run({k: v.copy() for k, v in run.tables.items()}, json.loads(json.dumps(run.meta)))


# Each corruption takes a fresh copy of the healthy run and a random generator, and damages it.
Corruption = Callable[[Run, np.random.Generator, float], Run]


def duplicated_requests(run: Run, rng: np.random.Generator, size: float) -> Run:
    """Rows written twice, as a retried write or a distributed run can do."""
    requests = run.tables[schema.REQUESTS]
    k = max(1, int(size * 50))
    again = requests.iloc[rng.choice(len(requests), k, replace=False)]
    run.tables[schema.REQUESTS] = pd.concat([requests, again], ignore_index=True)
    return run


def conflicting_duplicate(run: Run, rng: np.random.Generator, size: float) -> Run:
    """The same request id with another ending: which one happened?"""
    requests = run.tables[schema.REQUESTS]
    answered = requests[requests["ttft_s"].notna()]
    row = answered.iloc[[int(rng.integers(len(answered)))]].copy()
    row["ttft_s"] = row["ttft_s"] + 0.5 + size
    row["e2e_s"] = row["e2e_s"] + 0.5 + size
    run.tables[schema.REQUESTS] = pd.concat([requests, row], ignore_index=True)
    return run


def server_clock_behind_slow_releases(run: Run, rng: np.random.Generator, size: float) -> Run:
    """Releases 3 s late on the server's own clock, which runs 2-20 s behind the client's:
    read naively, slow releases look instant."""
    events = run.tables[schema.SERVER_EVENTS]
    released = events["event"].eq(EventKind.RELEASED)
    events.loc[released, "t"] += 3.0
    events.loc[events["seq"] >= 0, "t"] -= 2.0 + 18.0 * size
    return run


def unfinished(run: Run, rng: np.random.Generator, size: float) -> Run:
    """A run whose status says it did not finish."""
    run.meta["status"] = "interrupted" if size < 0.5 else "error"
    run.meta["error"] = "the load generator was stopped"
    return run


def rows_missing(run: Run, rng: np.random.Generator, size: float) -> Run:
    """Fewer rows than the run counted when it ended (a lost part)."""
    requests = run.tables[schema.REQUESTS]
    k = max(1, int(size * len(requests) / 3))
    run.tables[schema.REQUESTS] = requests.iloc[k:]
    return run


def outside_the_contract(run: Run, rng: np.random.Generator, size: float) -> Run:
    """Names nobody defined: a priority `Critical`, a class `short-qa`."""
    requests = run.tables[schema.REQUESTS]
    rows = rng.choice(len(requests), max(1, int(size * 80)), replace=False)
    column, value = (("priority", "Critical"), ("traffic_class", "short-qa"))[int(size * 10) % 2]
    requests.loc[requests.index[rows], column] = value
    return run


def impossible_timing(run: Run, rng: np.random.Generator, size: float) -> Run:
    """A negative TTFT, a TTFT longer than the request, or none on a streamed answer."""
    requests = run.tables[schema.REQUESTS]
    answered = requests.index[requests["ttft_s"].notna() & requests["chunks"].gt(0)]
    row = answered[int(rng.integers(len(answered)))]
    kind = int(size * 30) % 3
    if kind == 0:
        requests.loc[row, "ttft_s"] = -0.05
    elif kind == 1:
        requests.loc[row, "ttft_s"] = float(requests.loc[row, "e2e_s"]) + 1.0
    else:
        requests.loc[row, "ttft_s"] = np.nan
    return run


def oom_behind_a_null(run: Run, rng: np.random.Generator, size: float) -> Run:
    """An OOM counter that went up across a missing reading."""
    samples = run.tables[schema.SAMPLES]
    oom = samples.index[samples["metric"].eq("kvgate_oom_total") & samples["target"].eq("r0")]
    k = 1 + int(size * (len(oom) - 3))
    samples.loc[oom[k], "value"] = np.nan
    samples.loc[oom[k + 1 :], "value"] = 1.0
    return run


def share_in_percent(run: Run, rng: np.random.Generator, size: float) -> Run:
    """A share gauge written in percent (0-100) where the contract means 0-1."""
    samples = run.tables[schema.SAMPLES]
    metric = ("kvgate_pool_usage_ratio", "kvgate_tenant_pool_share")[int(size * 10) % 2]
    rows = samples["metric"].eq(metric)
    samples.loc[rows, "value"] *= 100.0
    return run


def records_from_before(run: Run, rng: np.random.Generator, size: float) -> Run:
    """Requests from hours before the run's start counted as its evidence."""
    requests = run.tables[schema.REQUESTS]
    k = max(1, int(size * 100))
    old = requests.iloc[rng.choice(len(requests), k, replace=False)].copy()
    old["request_id"] = [f"old-{i}" for i in range(k)]
    old["t_send"] -= 3600.0 * (1.0 + size)
    run.tables[schema.REQUESTS] = pd.concat([requests, old], ignore_index=True)
    return run


def released_by_another_replica(run: Run, rng: np.random.Generator, size: float) -> Run:
    """Cancelled requests' releases logged by a replica that never held them: the holder
    never freed their blocks."""
    events = run.tables[schema.SERVER_EVENTS]
    requests = run.tables[schema.REQUESTS]
    cancelled = requests.loc[requests["cancel_at"].notna(), "request_id"]
    moved = events["event"].eq(EventKind.RELEASED) & events["request_id"].isin(cancelled)
    events.loc[moved, "replica"] = events.loc[moved, "replica"].map({"r0": "r1", "r1": "r0"})
    return run


def streams_without_content(run: Run, rng: np.random.Generator, size: float) -> Run:
    """Critical questions answered 200 with `[DONE]` and no content: no first token came."""
    requests = run.tables[schema.REQUESTS]
    critical = requests.index[
        requests["priority"].eq("critical")
        & requests["traffic_class"].eq("short_qa")
        & requests["outcome"].eq(Outcome.OK)
    ]
    rows = rng.choice(critical, max(1, int((0.1 + 0.4 * size) * len(critical))), replace=False)
    requests.loc[rows, ["ttft_s", "itl_mean_s", "itl_p50_s", "itl_p99_s", "itl_max_s"]] = np.nan
    requests.loc[rows, "chunks"] = 0
    requests.loc[rows, "completion_tokens"] = 0
    return run


CORRUPTIONS: dict[str, Corruption] = {
    fn.__name__: fn
    for fn in (
        duplicated_requests,
        conflicting_duplicate,
        server_clock_behind_slow_releases,
        unfinished,
        rows_missing,
        outside_the_contract,
        impossible_timing,
        oom_behind_a_null,
        share_in_percent,
        records_from_before,
        released_by_another_replica,
        streams_without_content,
    )
}


def test_the_healthy_run_passes(healthy: Run, tmp_path: Path) -> None:
    """Without it, "never PASS" below would hold of a run that fails anyway."""
    assert judged(copy(healthy).write(tmp_path / "run")) == Status.PASS


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_each_corruption_at_its_smallest_is_not_a_pass(
    name: str, healthy: Run, tmp_path: Path
) -> None:
    run = CORRUPTIONS[name](copy(healthy), np.random.default_rng(0), 0.0)
    assert judged(run.write(tmp_path / "run")) != Status.PASS


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(sorted(CORRUPTIONS)),
    size=st.floats(min_value=0.0, max_value=1.0),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_no_corruption_of_a_healthy_run_reads_pass(
    name: str, size: float, seed: int, healthy: Run, tmp_path: Path
) -> None:
    out = tmp_path / f"{name}-{seed}-{size:.6f}"
    shutil.rmtree(out, ignore_errors=True)
    run = CORRUPTIONS[name](copy(healthy), np.random.default_rng(seed), size)
    assert judged(run.write(out)) != Status.PASS, f"{name} (size {size:.3f}, seed {seed})"
