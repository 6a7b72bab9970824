"""A replay's schedule: its requests went out when the trace said, or the run is INVALID.

An open-loop replay is a claim about arrival times: production's requests, at production's
moments (scaled). A load generator that could not keep up sent them late, bunched behind
the delay, and a server judged on that traffic was judged on another load than the trace's.
So each replayed request records its planned send time (`t_scheduled`), and this check
holds the p99 of `t_send - t_scheduled` to the run's bound (samplers.schedule_error_bound_ms,
kept in meta.json's `replay`). 25 ms by default: a thirty-sixth of the critical first-token
line (900 ms), and well inside the gaps between a trace's arrivals, yet a load generator that
cannot keep up falls behind by far more (its backlog grows request by request). Measured on
a 2-core host with the reference server beside the load generator: p99 13-17 ms (the hour
replay at 20 requests a second, and a minute of it beside 106 users), p50 3-5 ms: the
operating system's scheduling of three busy processes on two cores, not the sender, which
alone keeps 0.1 ms (`kvgate bench replay` measures it against a light server).
A request planned and never sent (the load ended before it)
is a slip without end: the run is INVALID too, unless the load was stopped early for a
reason meta.json gives (an abort, a decided gate), which other checks judge.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gates import schema
from gates.evidence.base import Effect, Finding, evidence_check
from gates.rundir import RunData

CHECK = "schedule_kept"
DEFAULT_BOUND_MS = 25.0  # harness/plan_trace.py's SCHEDULE_ERROR_BOUND_MS, for runs without it


@evidence_check(CHECK, order=240)
def schedule_kept(run: RunData) -> list[Finding]:
    """A replay's requests went out on time: schedule error p99 within its bound, none unsent."""
    requests = run.requests
    if "t_scheduled" not in requests.columns:
        return []
    replayed = requests[requests["t_scheduled"].notna()]
    replay = run.meta.get("replay")
    replay = replay if isinstance(replay, dict) else {}
    found: list[Finding] = []
    if len(replayed):
        late_ms = (replayed["t_send"] - replayed["t_scheduled"]).to_numpy(float) * 1000.0
        bound = _bound(replay)
        p99, worst = float(np.percentile(late_ms, 99)), float(late_ms.max())
        if p99 > bound:
            found.append(
                Finding(
                    CHECK,
                    Effect.INVALID,
                    f"the replay's requests went out {p99:.1f} ms late at p99 (max "
                    f"{worst:.0f} ms, {len(late_ms)} requests), past its bound of {bound:g} ms "
                    "(samplers.schedule_error_bound_ms): the server did not get the trace's "
                    "arrivals; replay slower (a larger time_scale), on a quieter host, or "
                    "across more load-generator processes (--processes)",
                    table=schema.REQUESTS,
                    column="t_send",
                    doubts_timing=True,
                )
            )
    unsent = replay.get("unsent")
    if isinstance(unsent, int) and unsent > 0 and not _stopped_early(run.meta):
        found.append(
            Finding(
                CHECK,
                Effect.INVALID,
                f"{unsent} of the replay's {replay.get('scheduled')} planned requests were "
                "never sent: the load ended first; leave load.duration_s out (the replay's "
                "span plus traffic.trace.drain_s) or shorten the trace's window",
                table=schema.REQUESTS,
            )
        )
    return found


def _bound(replay: dict[str, Any]) -> float:
    value = replay.get("schedule_error_bound_ms")
    return float(value) if isinstance(value, int | float) and value > 0 else DEFAULT_BOUND_MS


def _stopped_early(meta: dict[str, Any]) -> bool:
    generator = meta.get("load_generator")
    return bool(meta.get("aborted")) or (
        isinstance(generator, dict) and bool(generator.get("stopped_early"))
    )
