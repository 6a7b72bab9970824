"""The load generator's loop lag (harness/looplag.py): the histogram's quantiles, the merge
of several processes' histograms, and a probe that measures a loop kept busy."""

from __future__ import annotations

import time

import gevent
import pytest

from harness.looplag import BUCKETS, LoopLag


def filled(late_ms: list[float]) -> LoopLag:
    lag = LoopLag()
    for ms in late_ms:
        if ms < BUCKETS:
            lag.counts[int(ms)] += 1
        else:
            lag.over.append(ms)
    return lag


def test_quantiles_are_the_upper_edges_of_their_millisecond_buckets() -> None:
    lag = filled([0.2] * 98 + [7.5, 1500.0])
    assert lag.summary() == {"ticks": 100, "p50": 1.0, "p99": 8.0, "max": 1500.0}


def test_a_p99_among_the_long_waits_is_their_own_value() -> None:
    lag = filled([0.5] * 90 + [2000.0 + i for i in range(10)])
    summary = lag.summary()
    assert summary is not None and summary["p99"] == 2008.0 and summary["max"] == 2009.0


def test_no_ticks_no_summary() -> None:
    assert LoopLag().summary() is None


def test_processes_merge_by_adding_counts() -> None:
    master = LoopLag()
    for part in (filled([1.5, 1.5]), filled([3.2, 1200.0])):
        master.add(part.as_message())
    assert master.counts[1] == 2 and master.counts[3] == 1 and master.over == [1200.0]
    summary = master.summary()
    assert summary is not None and summary["ticks"] == 4 and summary["max"] == 1200.0


@pytest.mark.timeout(30)
def test_a_loop_held_busy_is_measured_late() -> None:
    """A greenlet that holds the loop without yielding makes the probe wake late by about as
    long; the probe is stopped and counts no more."""
    lag = LoopLag()
    lag.start()
    gevent.sleep(0.05)
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:  # the loop cannot run the probe meanwhile
        pass
    gevent.sleep(0.05)
    lag.stop()
    summary = lag.summary()
    assert summary is not None and summary["max"] >= 250.0
    ticks = summary["ticks"]
    gevent.sleep(0.05)
    assert lag.summary() == summary and summary["ticks"] == ticks


@pytest.mark.timeout(30)
def test_a_probe_stopped_while_its_wake_is_due_counts_no_more() -> None:
    """Stopped just as its timer came due (the loop held past it), the probe must not count
    the wake that the kill is racing."""
    lag = LoopLag()
    lag.start()
    gevent.sleep(0.05)
    end = time.perf_counter() + 0.03  # the probe's 10 ms wake comes due meanwhile
    while time.perf_counter() < end:
        pass
    ticks = sum(lag.counts) + len(lag.over)
    lag.stop()
    gevent.sleep(0.05)
    assert sum(lag.counts) + len(lag.over) == ticks
