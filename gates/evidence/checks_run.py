"""Evidence checks on the run as a whole: its records lie inside it (run window), it finished
(run finished), its requests span the load it planned (load covered), and every row it wrote
was read (tables complete).

What these find cannot be corrected by reading harder: a run that stopped halfway or lost
part of a table is judged on what is left, and its verdict is INVALID (a blocking gate that
failed for good still FAILs it: gates/evaluator.py, rule 1), telling the user to re-run.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from gates import schema
from gates.evidence.base import Effect, Finding, evidence_check, flagged
from gates.keys import isin
from gates.rundir import DAMAGED, RunData

# How far outside meta.t_start..t_end a record may lie. t_start is taken before the target
# starts and t_end after every writer has closed, so on one host the run's records lie
# inside with seconds to spare; on several, each host's clock is kept by NTP to within
# milliseconds. Five seconds is far beyond what a synced clock errs by (a clock off by more
# is the clock check's matter), and far below the gap between two runs, whose targets take
# longer than that to start.
WINDOW_SLACK_S = 5.0
# A finished load is missing records when its requests, from the first send to the last
# answer, span less than this share of it and fall short by more than COVERED_SLACK_S. The
# first request leaves as the first user starts, and users keep a request in flight or wait
# between two until the load stops, so a healthy run falls short by a user's wait at most:
# seconds, not a fifth of its load.
COVERED_SHARE = 0.8
COVERED_SLACK_S = 10.0


def _window(meta: dict[str, Any]) -> tuple[float, float] | None:
    t0, t1 = meta.get("t_start"), meta.get("t_end")
    if isinstance(t0, int | float) and isinstance(t1, int | float):
        return float(t0), float(t1)
    return None


def _outside(t: pd.Series, window: tuple[float, float]) -> pd.Series:
    return (t < window[0] - WINDOW_SLACK_S) | (t > window[1] + WINDOW_SLACK_S)


def _by_up_to(t: pd.Series, window: tuple[float, float]) -> str:
    """How far the furthest of `t` lies outside `window`: "up to 3600 s before it"."""
    before = window[0] - float(t.min())
    after = float(t.max()) - window[1]
    return " and ".join(
        f"up to {gap:.0f} s {side} it"
        for gap, side in ((before, "before"), (after, "after"))
        if gap > WINDOW_SLACK_S
    )


@evidence_check("run_window", order=150)
def run_window(run: RunData) -> list[Finding]:
    """Every record lies within the run, meta.t_start to meta.t_end (5 s of slack)."""
    window = _window(run.meta)
    if window is None:
        return [
            Finding(
                "run_window",
                Effect.NOTE,
                "meta.json gives no t_start and t_end, so no record could be checked against "
                "the run's window",
            )
        ]
    shown = f"[{window[0]:.3f}, {window[1]:.3f}]"
    found = []
    requests = run.requests
    stray = _outside(requests["t_send"], window)
    if stray.any():
        found.append(
            flagged(
                "run_window",
                Effect.INVALID,
                f"{int(stray.sum())} request(s) sent outside the run's window {shown}, "
                f"{_by_up_to(requests.loc[stray, 't_send'], window)}: records of another run "
                "(or of a clock far off) in this one; they were dropped, and a run directory "
                "that holds another run's records cannot show that it holds all of its own: "
                "re-run into a fresh directory",
                schema.REQUESTS,
                requests.index[stray],
                "t_send",
            )
        )
        run.requests = requests[~stray]
    found += _server_events_in_window(run, window, shown)
    samples = run.samples
    stray = _outside(samples["t"], window)
    if stray.any():
        found.append(
            flagged(
                "run_window",
                Effect.NOTE,
                f"{int(stray.sum())} sample(s) taken outside the run's window {shown}, "
                f"{_by_up_to(samples.loc[stray, 't'], window)}, were left out",
                schema.SAMPLES,
                samples.index[stray],
                "t",
            )
        )
        run.samples = samples[~stray]
    return found


def _server_events_in_window(
    run: RunData, window: tuple[float, float], shown: str
) -> list[Finding]:
    """A server that outlives runs (an external one, or one kvgate did not start) shows its
    whole event log from the first read, rows from before this run included: those that are
    about none of the run's requests (lifecycle rows, other clients' requests) are left out
    with a note. A row about one of the run's own requests outside its window means the
    server's clock and the client's disagree beyond repair: the run is INVALID."""
    events = run.server_events
    stray = _outside(events["t"], window)
    if not stray.any():
        return []
    own = pd.Series(isin(events["request_id"], run.requests["request_id"]), index=events.index)
    found = []
    foreign = stray & ~own
    if foreign.any():
        found.append(
            flagged(
                "run_window",
                Effect.NOTE,
                f"{int(foreign.sum())} server event(s) outside the run's window {shown}, "
                f"{_by_up_to(events.loc[foreign, 't'], window)}, about none of its requests "
                "(a long-lived server's log from before the run, or other clients), were left out",
                schema.SERVER_EVENTS,
                events.index[foreign],
                "t",
            )
        )
        run.server_events = events[~foreign]
    mine = stray & own
    if mine.any():
        found.append(
            flagged(
                "run_window",
                Effect.INVALID,
                f"{int(mine.sum())} server event(s) about the run's own requests lie outside its "
                f"window {shown}, {_by_up_to(events.loc[mine, 't'], window)}: the server's clock "
                "and the client's disagree by more than any timing of the run could be trusted "
                "through; sync the hosts' clocks (NTP) and re-run",
                schema.SERVER_EVENTS,
                events.index[mine],
                "t",
            )
        )
    return found


# -- completeness --------------------------------------------------------------------------


@evidence_check("run_finished", order=200)
def run_finished(run: RunData) -> list[Finding]:
    """The run finished: meta.status is `completed`, not interrupted, failed or still running."""
    status, error = run.meta.get("status"), run.meta.get("error")
    if status is None:
        return [
            Finding(
                "run_finished",
                Effect.NOTE,
                "meta.json has no status (a run built by hand, or by an older kvgate): "
                "whether the run finished could not be checked",
            )
        ]
    if status == "completed":
        return []
    why = f" ({error})" if error else ""
    if status == "running":
        happened = (
            "has not finished: meta.json says `running`, so it is still going or its harness "
            "stopped before its last write (killed, or out of memory)"
        )
    elif status == "interrupted":
        happened = f"was interrupted{why}"
    else:  # "error": the reader refuses any status contract.runmeta.RunStatus does not name
        happened = f"ended in an error{why}; harness-error.log in the run directory has the trace"
    return [
        Finding(
            "run_finished",
            Effect.INVALID,
            f"the run {happened}; its tables hold only what was written until then, which "
            "cannot stand for the run that was planned: re-run it",
        )
    ]


def _load_stop(meta: dict[str, Any], shape: str) -> str | None:
    """Why the load ended before its planned duration, where meta.json says so (a gate's
    abort, `load.stop_if_failing`, a stop from the web page, a step ramp that found its
    knee), or where the shape ends by itself; None for a constant load that ran on."""
    aborted = meta.get("aborted")
    if isinstance(aborted, dict) and aborted.get("gate"):
        return f"aborted by gate {aborted['gate']}"
    generator = meta.get("load_generator")
    stopped = generator.get("stopped_early") if isinstance(generator, dict) else None
    if stopped:
        return f"stopped early: {stopped}"
    capacity = meta.get("capacity")
    reason = capacity.get("stop_reason") if isinstance(capacity, dict) else None
    if reason:
        return f"the ramp stopped: {reason}"
    return None if shape == "constant" else f"the {shape} shape ends by itself"


def _span(windows: Any) -> tuple[float, float] | None:
    span = windows.get("stress") if isinstance(windows, dict) else None
    if isinstance(span, list | tuple) and len(span) == 2:
        t0, t1 = span
        if isinstance(t0, int | float) and isinstance(t1, int | float):
            return float(t0), float(t1)
    return None


def _busy(requests: pd.DataFrame, stress: tuple[float, float] | None) -> tuple[float, float]:
    """From the first request's send to the last one's end (a request is load while it is in
    flight: a few users with long answers send seldom, but are never idle), within the stress
    window where there is one; (0, 0) without requests."""
    sent = requests["t_send"]
    ended = sent + requests["e2e_s"].fillna(0.0)
    if sent.dropna().empty:
        return 0.0, 0.0
    first, last = float(sent.min()), float(ended.max())
    if stress is not None:
        first, last = max(first, stress[0]), min(last, stress[1])
    return first, last


@evidence_check("load_covered", order=210)
def load_covered(run: RunData) -> list[Finding]:
    """The requests span the load as planned (or as it ran, where meta.json says why it stopped)."""
    if run.meta.get("status", "completed") != "completed":
        return []  # run_finished says what happened
    plan = run.meta.get("plan")
    load = plan.get("load") if isinstance(plan, dict) else None
    if not isinstance(load, dict):
        return []  # nothing planned to hold the records against (a run built by hand)
    stress = _span(run.meta.get("windows"))
    stop = _load_stop(run.meta, str(load.get("shape") or "constant"))
    planned = load.get("duration_s")
    if stop is not None:
        if stress is None:
            return []
        target, of = (
            stress[1] - stress[0],
            f"the {stress[1] - stress[0]:.0f} s the load ran ({stop})",
        )
    elif isinstance(planned, int | float) and planned > 0:
        target, of = float(planned), f"{planned:.0f} s planned"
    else:
        return []
    first, last = _busy(run.requests, stress)
    covered = max(last - first, 0.0)
    if covered >= COVERED_SHARE * target or target - covered <= COVERED_SLACK_S:
        return []
    where = ""
    if stress is not None and covered > 0:
        where = f" (from +{first - stress[0]:.0f} s to +{last - stress[0]:.0f} s of the load)"
    return [
        Finding(
            "load_covered",
            Effect.INVALID,
            f"the requests cover {covered:.0f} s of {of}{where}: the records of the rest are "
            "missing (a worker that lost them, a table cut short), so the run shows less load "
            "than it claims to have judged; re-run",
            table=schema.REQUESTS,
            column="t_send",
        )
    ]


@evidence_check("tables_complete", order=220)
def tables_complete(run: RunData) -> list[Finding]:
    """Every row the run wrote was read: meta.tables' counts, no part missing, nothing set aside."""
    counts = run.meta.get("tables")
    counts = counts if isinstance(counts, dict) else {}
    found = []
    for table in schema.TABLES:
        problems = []
        expected, read = counts.get(table), run.rows_read.get(table)
        if isinstance(expected, int) and read is not None and read != expected:
            problems.append(_count_problem(run, table, expected, read))
        numbers = run.parts.get(table, ())
        missing = sorted(set(range(1, max(numbers, default=0) + 1)) - set(numbers))
        if missing:
            names = ", ".join(f"{table}.part-{n:05d}.parquet" for n in missing[:5])
            problems.append(
                f"{len(missing)} part(s) of 1..{max(numbers)} are missing ({names}"
                f"{', ...' if len(missing) > 5 else ''}), each up to 200,000 rows"
            )
        aside = run.set_aside.get(table, ())
        if aside:
            problems.append(
                f"{', '.join(aside)} {'was' if len(aside) == 1 else 'were'} set aside as "
                f"damaged ({DAMAGED}), so none of {'its' if len(aside) == 1 else 'their'} rows "
                "were judged"
            )
        if problems:
            found.append(
                Finding(
                    "tables_complete",
                    Effect.INVALID,
                    f"table {table} is incomplete: {'; '.join(problems)}. Judged on what is "
                    "left, the run cannot show what the rest held: restore the missing files "
                    "from a copy of the run, or re-run",
                    table=table,
                )
            )
    return found


def _count_problem(run: RunData, table: str, expected: int, read: int) -> str:
    source = run.sources.get(table, "absent")
    if read < expected:
        where = f"{table}.parquet is missing" if source == "absent" else f"read from {source}"
        return (
            f"meta.json counts {expected} rows (meta.tables, at compaction) but {read} were "
            f"read, {expected - read} missing ({where})"
        )
    return (
        f"meta.json counts {expected} rows (meta.tables, at compaction) but {read} were read: "
        f"{read - expected} rows were added after the run ended"
    )
