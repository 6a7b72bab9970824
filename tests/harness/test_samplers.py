"""Prometheus parsing, the event cursor, replica lifecycle rows, and the simulator-lag summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from harness.samplers.events import EventCollector, LifecycleMonitor, Replica, ReplicaTable
from harness.samplers.http import Response
from harness.samplers.process import oom_detector
from harness.samplers.prometheus import Endpoint, PrometheusSampler, parse_metrics
from harness.summary import sim_lag_ms

METRICS = """# HELP kvgate_pool_usage_ratio usage
# TYPE kvgate_pool_usage_ratio gauge
kvgate_pool_usage_ratio 0.5
# TYPE kvgate_waiting_requests gauge
kvgate_waiting_requests{priority="batch"} 3
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25
# TYPE python_gc_objects_collected counter
python_gc_objects_collected_total{generation="0"} 10
"""


def test_parse_metrics_keeps_known_prefixes_with_canonical_labels() -> None:
    rows = parse_metrics(METRICS, t=1.0, target="r0", prefixes=["kvgate_", "vllm:"])
    got = {(r["metric"], r["labels"]): r["value"] for r in rows}
    assert got == {
        ("kvgate_pool_usage_ratio", ""): 0.5,
        ("kvgate_waiting_requests", "priority=batch"): 3.0,
        ("vllm:kv_cache_usage_perc", "engine=0,model_name=m"): 0.25,
    }


def test_a_failed_scrape_is_a_row_not_an_exception() -> None:
    def fetch(url: str, token: str | None = None) -> Response:
        if "down" in url:
            raise OSError("refused")
        return Response(200, {}, METRICS.encode())

    endpoints = [Endpoint("gateway", "http://up"), Endpoint("r1", "http://down")]
    rows = PrometheusSampler(lambda: endpoints, ["kvgate_"], fetch=fetch).sample()
    assert {r["target"] for r in rows if r["metric"] == "kvgate_pool_usage_ratio"} == {"gateway"}
    errors = [r for r in rows if r["metric"] == "scrape_error"]
    assert (
        len(errors) == 1 and errors[0]["target"] == "r1" and "refused" in str(errors[0]["labels"])
    )


def test_event_collector_follows_the_cursor_and_keeps_it_on_errors() -> None:
    pages = {
        "": (b'{"t": 1, "replica": "r0", "seq": 0, "event": "admitted", "request_id": "a"}\n', "1"),
        "?after=1": (b'{"t": 2, "replica": "r1", "seq": 0, "event": "finished"}\n', "2"),
        "?after=2": (b"", "2"),
    }
    calls: list[str] = []

    def fetch(url: str, token: str | None = None) -> Response:
        query = url.split("/debug/events", 1)[1]
        calls.append(query)
        if query == "?after=2" and calls.count(query) > 1:
            return Response(503, {}, b"")
        body, cursor = pages[query]
        return Response(200, {"x-next-cursor": cursor}, body)

    collector = EventCollector("http://gw", fetch=fetch)
    rows = collector.poll()
    assert [r["event"] for r in rows] == ["admitted", "finished"]
    assert rows[0]["request_id"] == "a" and rows[1]["request_id"] is None
    assert collector.cursor == "2"
    assert collector.poll() == [] and collector.cursor == "2" and collector.errors == 1


def listing(*items: dict[str, Any]) -> Response:
    return Response(200, {}, json.dumps(list(items)).encode())


def test_lifecycle_rows_for_start_death_and_a_restart_between_polls(tmp_path: Path) -> None:
    events = [{"event": "replica_started"}, {"event": "oom"}, {"event": "replica_died"}]
    (tmp_path / "r1.events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "r0.events.jsonl").write_text(json.dumps({"event": "oom"}) + "\n")
    answers = [
        listing(
            {"id": "r0", "pid": 1, "state": "running", "restarts": 0},
            {"id": "r1", "pid": 2, "state": "running", "restarts": 0},
        ),
        listing(
            {"id": "r0", "pid": 1, "state": "dead", "exit_code": -9, "restarts": 0},
            {"id": "r1", "pid": 5, "state": "running", "exit_code": 1, "restarts": 1},
        ),
        listing(
            {"id": "r0", "pid": 7, "state": "running", "restarts": 1},
            {"id": "r1", "pid": 5, "state": "running", "restarts": 1},
        ),
    ]
    table = ReplicaTable([Replica("r0", "http://r0", 1), Replica("r1", "http://r1", 2)])
    monitor = LifecycleMonitor(
        "http://gw",
        "key",
        table,
        oom_detector(str(tmp_path)),
        fetch=lambda url, token: answers.pop(0),
    )
    first, second, third = monitor.poll(), monitor.poll(), monitor.poll()
    assert [(r["replica"], r["event"]) for r in first] == [
        ("r0", "replica_started"),
        ("r1", "replica_started"),
    ]
    assert [(r["replica"], r["event"], r["reason"]) for r in second] == [
        ("r0", "replica_died", "harness: exit_code=-9"),  # SIGKILL: never an OOM
        ("r1", "replica_died", "harness: exit_code=1 oom (CUDA out of memory)"),
        ("r1", "replica_started", "harness: restart 1"),
    ]
    assert [(r["replica"], r["event"]) for r in third] == [("r0", "replica_started")]
    seqs = [r["seq"] for r in first + second + third]
    assert len(set(seqs)) == len(seqs) and all(isinstance(s, int) and s < 0 for s in seqs)
    assert table.pids() == {7, 5}


def test_sim_lag_p99_from_histogram_increases_across_a_counter_reset() -> None:
    rows = []
    # r0: 100 steps, 99 of them under 10 ms; r1 restarted (its counters reset) mid-run
    for t, le, value in [
        (0, "0.01", 0),
        (0, "0.1", 0),
        (0, "+Inf", 0),
        (1, "0.01", 99),
        (1, "0.1", 100),
        (1, "+Inf", 100),
    ]:
        rows.append(
            {
                "t": t,
                "target": "r0",
                "metric": "kvgate_step_lag_seconds_bucket",
                "labels": f"le={le}",
                "value": value,
            }
        )
    for t, le, value in [
        (0, "0.01", 50),
        (0, "0.1", 50),
        (0, "+Inf", 50),
        (1, "0.01", 0),
        (1, "0.1", 100),
        (1, "+Inf", 100),
    ]:
        rows.append(
            {
                "t": t,
                "target": "r1",
                "metric": "kvgate_step_lag_seconds_bucket",
                "labels": f"le={le}",
                "value": value,
            }
        )
    rows.append(
        {
            "t": 1,
            "target": "r0",
            "metric": "kvgate_step_lag_max_seconds",
            "labels": "",
            "value": 0.05,
        }
    )
    lag = sim_lag_ms(pd.DataFrame(rows))
    # 99 of 200 increases are <= 10 ms, all 200 <= 100 ms: p99 is the 100 ms bucket
    assert lag == {"p99": 100.0, "max": 50.0}


def test_sim_lag_is_none_without_samples() -> None:
    empty = pd.DataFrame(columns=["t", "target", "metric", "labels", "value"])
    assert sim_lag_ms(empty) == {"p99": None, "max": None}


def _lag_rows(target: str, per_second: list[dict[str, int]]) -> list[dict[str, object]]:
    """Cumulative lag-histogram scrapes, one per second, from per-second bucket counts."""
    rows: list[dict[str, object]] = []
    totals: dict[str, int] = {}
    for t, counts in enumerate(per_second):
        for le, n in counts.items():
            totals[le] = totals.get(le, 0) + n
        for le, value in totals.items():
            rows.append(
                {
                    "t": float(t),
                    "target": target,
                    "metric": "kvgate_step_lag_seconds_bucket",
                    "labels": f"le={le}",
                    "value": value,
                }
            )
    return rows


def test_sim_lag_p99_is_over_time_so_a_starved_burst_is_not_diluted_by_steps() -> None:
    # 200 seconds of 100 steps each, all under 10 ms, except 3 seconds in which the
    # simulator was starved: its 5 steps in each of them lagged up to 250 ms. Per step that
    # is 15 of 20,000 (under 1%); per second it is 3 of 200 (1.5%), and those seconds are
    # when requests were delayed.
    quiet = {"0.01": 100, "0.25": 100, "+Inf": 100}
    starved = {"0.01": 0, "0.25": 5, "+Inf": 5}
    seconds = [{"0.01": 0, "0.25": 0, "+Inf": 0}]
    seconds += [starved if t in (3, 4, 5) else quiet for t in range(1, 201)]
    lag = sim_lag_ms(pd.DataFrame(_lag_rows("r0", seconds)))
    assert lag["p99"] == 250.0


def test_sim_lag_ignores_seconds_in_which_no_step_ran() -> None:
    quiet = {"0.01": 100, "0.25": 100, "+Inf": 100}
    idle = {"0.01": 0, "0.25": 0, "+Inf": 0}
    seconds = [idle, quiet, idle, idle, quiet]
    assert sim_lag_ms(pd.DataFrame(_lag_rows("r0", seconds)))["p99"] == 10.0


def test_a_replicas_own_fault_window_is_not_simulator_lag() -> None:
    """A paused replica's frozen step loop lags by design: its pause (and a few seconds of
    catching up) is left out, while the same lag on the other replica still counts."""
    quiet = {"0.01": 100, "0.25": 100, "+Inf": 100}
    frozen = {"0.01": 0, "0.25": 0, "+Inf": 5}  # steps that ended > 250 ms late
    seconds = [quiet] * 20 + [frozen] + [quiet] * 79
    rows = _lag_rows("r0", seconds) + _lag_rows("r1", [quiet] * 100)
    faults = pd.DataFrame({"target": ["r0"], "t_start": [19.5], "t_end": [21.0], "kind": ["pause"]})
    assert sim_lag_ms(pd.DataFrame(rows), faults)["p99"] == 10.0
    on_the_other = pd.DataFrame({**faults, "target": ["r1"]})
    assert sim_lag_ms(pd.DataFrame(rows), on_the_other)["p99"] == 10.0  # 1 of 198 seconds
    rows_r1 = _lag_rows("r0", [quiet] * 100) + _lag_rows("r1", [frozen] * 3 + [quiet] * 97)
    p99 = sim_lag_ms(pd.DataFrame(rows_r1), faults)["p99"]
    assert p99 is not None and p99 > 250.0
