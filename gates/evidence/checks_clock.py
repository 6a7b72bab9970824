"""Clock consistency: the client's table and each replica's server events on one time line.

The load generator stamps `requests` (t_send, and the durations after it) with its clock;
each replica stamps its own `server_events` rows with its host's clock. Metrics that mix
the two (cancel to release, a death after a cancel, waiting behind queued work, admissions
in a load phase) read nonsense when the clocks differ: a server a few seconds behind makes
slow releases look instant, one ahead makes a good server fail. So, per replica (each may
be its own host), this check bounds the offset theta = server clock - client clock from the
records themselves and puts the server's rows on the client's clock when it safely can.

The bound. A request's first entry event on a replica (`queued`, `admitted` or `rejected`:
contract.EventKind) happened after the client sent it (t_send) and before the client heard
the server's decision: its first content chunk (ttft_s), else the answer (a replica sends
its response head only once it has admitted or refused the request, so a request with an
http_status heard it by the end, e2e_s, or by its cancel, cancel_at, when the client cut
the stream first). So theta lies in [t_event - t_heard, t_event - t_send]. A request that
never heard from the server (cancelled or timed out while queued, stopped by the load
generator) bounds it from above only: the server may still have been reading it after the
client gave up. A request seen on two replicas (a retry after a failure) bounds them by its
answer alone, since its first token may have come from either.

Intersecting the intervals robustly. The true offset lies in every interval, so the
intersection is the bound; but a single stamp taken late (a simulator lagging behind its
clock, a recorder that logs after the step) would make it empty and condemn a sound run. The
bound is therefore the set of offsets that lie in the most intervals (Marzullo's
intersection, as NTP uses it to outvote a few false clocks), provided it leaves out at most
OUTLIER_SHARE of them; the requests left out are named in a note. When every interval
agrees, that is their plain intersection, as tight as the records allow. A clock that
stepped during the run splits the intervals into two large groups that no offset
satisfies: that is no outlier, and the run is INVALID.

The decision, per replica:
- 0 within the bound (give or take SLACK_S, the stamps' own resolution): the clocks agree,
  and nothing is said.
- 0 outside a tight bound (width at most TIGHT_S): every server-stamped row of the replica
  is shifted by the bound's midpoint, so what is judged is off by at most TIGHT_S / 2
  (25 ms) - below the release gate's 0.5 s warn margin and its 0.5 s skew allowance,
  and a fortieth of the batch gate's 1 s settling time - and a note gives the offset and
  its bound.
- otherwise: INVALID with `doubts_timing`, since no timing across the two clocks can
  prove a breach, and the bound says how far apart they may be.

Only the server's own rows move. The harness writes lifecycle rows too (negative `seq`,
gates/schema.py), and every samples row is stamped by the harness when it scrapes or
polls (Prometheus, the simulated GPU's /debug/gpu, NVML, process stats:
harness/samplers/), as are the faults table and meta.json's windows: all on the client's
side, so none of them is corrected.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from contract import EventKind
from gates.evidence.base import Effect, Finding, evidence_check, flagged
from gates.keys import first_index, in_time, numbered, pair_codes, text_codes
from gates.rundir import RunData

CHECK = "clock_offset"
ENTRY_EVENTS = (str(EventKind.QUEUED), str(EventKind.ADMITTED), str(EventKind.REJECTED))
# A bound this narrow is corrected by its midpoint (error at most half of it).
TIGHT_S = 0.05
# Stamps a few instructions apart (t_send before the request leaves, an event stamped as
# the scheduler decides) agree to better than this; an offset below it is no offset.
SLACK_S = 0.001
# The share of a replica's requests whose intervals may disagree with the rest.
OUTLIER_SHARE = 0.01


@dataclass(frozen=True, slots=True)
class OffsetBound:
    """What one replica's records say of its clock: theta in [lo, hi] (seconds, server minus
    client) from `pairs` requests, `outliers` of them left out; None bounds: they agree on
    no offset."""

    replica: str
    lo: float | None
    hi: float | None
    pairs: int
    outliers: int

    @property
    def width(self) -> float:
        return math.inf if self.lo is None or self.hi is None else self.hi - self.lo

    @property
    def midpoint(self) -> float:
        assert self.lo is not None and self.hi is not None
        return (self.lo + self.hi) / 2

    def text(self) -> str:
        if self.lo is None or self.hi is None:
            return "no single offset"
        low = "-inf" if math.isinf(self.lo) else f"{self.lo:+.3f}"
        return f"[{low}, {self.hi:+.3f}] s"


def offset_intervals(run: RunData) -> pd.DataFrame:
    """One row per (replica, request) seen by both sides, in the table's order of their
    first entry events: `lo` and `hi` bound theta, `row` is the server_events row of the
    request's first entry event on that replica."""
    events = run.server_events
    server_rows = ~events["seq"].lt(0)  # the harness's rows count down from -1
    wanted = server_rows & events["event"].isin(ENTRY_EVENTS) & events["request_id"].notna()
    entry = events.loc[wanted, ["replica", "request_id", "t"]]
    if entry.empty:
        return pd.DataFrame(columns=["replica", "request_id", "lo", "hi", "row"])
    # each (replica, request)'s earliest entry event
    ids = text_codes(entry["request_id"])
    pairs = numbered(pair_codes(text_codes(entry["replica"]), ids, int(ids.max()) + 1))[0]
    first = in_time(pairs, entry["t"].to_numpy(dtype=float), int(pairs.max()) + 1, last=False)
    first = np.sort(first)
    sent = run.requests.loc[
        run.requests["t_send"].notna(),
        ["request_id", "t_send", "ttft_s", "e2e_s", "cancel_at", "http_status"],
    ]
    match = first_index(entry["request_id"].iloc[first], sent["request_id"])
    first, match = first[match >= 0], match[match >= 0]

    def sent_value(column: str) -> np.ndarray:
        values: np.ndarray = _values(sent[column])[match]
        return values

    t_send = sent_value("t_send")
    answered = ~np.isnan(sent_value("http_status"))
    end = t_send + sent_value("e2e_s")
    end = np.where(answered, np.fmin(end, sent_value("cancel_at")), np.nan)
    which = numbered(ids[first])[0]
    one_replica = np.bincount(which)[which] == 1
    first_token = np.where(one_replica, t_send + sent_value("ttft_s"), np.nan)
    seen = np.fmin(first_token, end)
    t = entry["t"].to_numpy(dtype=float)[first]
    lo = np.where(np.isnan(seen), -np.inf, t - seen)
    return pd.DataFrame(
        {
            "replica": entry["replica"].array.take(first),
            "request_id": entry["request_id"].array.take(first),
            "lo": lo,
            "hi": t - t_send,
            "row": entry.index.to_numpy()[first],
        }
    )


def _values(column: pd.Series) -> np.ndarray:
    values: np.ndarray = column.to_numpy(dtype=float, na_value=np.nan)
    return values


def agreed_bound(lo: np.ndarray, hi: np.ndarray, allowed: int) -> tuple[float, float] | None:
    """The values that lie in as many of the closed intervals [lo_i, hi_i] as any value does
    (their hull), provided that leaves out at most `allowed` intervals; None otherwise (the
    intervals contradict each other). With `allowed` 0, the plain intersection."""
    n = len(lo)
    if n == 0:
        return None
    starts, ends = np.sort(lo), np.sort(hi)

    def holding(x: np.ndarray) -> np.ndarray:
        """How many closed intervals hold each value of `x`."""
        held: np.ndarray = np.searchsorted(starts, x, side="right") - np.searchsorted(
            ends, x, side="left"
        )
        return held

    # The most intervals are held at some interval's start; the hull of the values held by
    # that many runs from the first such start to the last end still holding that many.
    at_starts = holding(starts)
    need = int(at_starts.max())
    if n - need > allowed:
        return None
    at_ends = holding(ends)
    return float(starts[at_starts == need][0]), float(ends[at_ends == need][-1])


def replica_bounds(intervals: pd.DataFrame) -> dict[str, OffsetBound]:
    """Each replica's bound on its clock's offset from the client's."""
    bounds = {}
    for replica, rows in intervals.groupby("replica", sort=True):
        lo, hi = rows["lo"].to_numpy(dtype=float), rows["hi"].to_numpy(dtype=float)
        allowed = int(len(rows) * OUTLIER_SHARE)
        found = agreed_bound(lo, hi, allowed)
        if found is None:
            bounds[str(replica)] = OffsetBound(str(replica), None, None, len(rows), 0)
            continue
        disagree = int(((hi < found[0]) | (lo > found[1])).sum())
        bounds[str(replica)] = OffsetBound(str(replica), *found, len(rows), disagree)
    return bounds


@evidence_check(CHECK, order=110)
def clock_offset(run: RunData) -> list[Finding]:
    """The client's and each replica's clocks agree, or are put on one line by a tight bound."""
    intervals = offset_intervals(run)
    findings = []
    for replica, bound in replica_bounds(intervals).items():
        mine = intervals[intervals["replica"].eq(replica)]
        findings.extend(_judge(run, bound, mine))
    return findings


def _judge(run: RunData, bound: OffsetBound, intervals: pd.DataFrame) -> list[Finding]:
    where = f"replica {bound.replica}'s clock"
    basis = f"from {bound.pairs} requests' send -> first server event"
    if bound.lo is None or bound.hi is None:
        return [
            _invalid(
                f"{where} agrees with the client's by no single offset ({basis}: no offset "
                f"fits all but {int(bound.pairs * OUTLIER_SHARE)} of them); a clock that "
                "stepped during the run, or events that are not these requests': sync the "
                "hosts' clocks (NTP, chrony) and re-run",
                intervals,
            )
        ]
    lo, hi = bound.lo, bound.hi
    findings = []
    if bound.outliers:
        findings.append(_outliers(bound, intervals))
    if lo - SLACK_S <= 0.0 <= hi + SLACK_S:
        return findings
    if bound.width <= TIGHT_S:
        return [*findings, _shift(run, bound)]
    return [
        *findings,
        _invalid(
            f"{where} is off the client's by an offset in {bound.text()} ({basis}), which "
            f"cannot be corrected (the bound is wider than {TIGHT_S * 1000:g} ms): no timing "
            "across the two clocks can be trusted; sync the hosts' clocks (NTP, chrony) and "
            "re-run",
            intervals,
        ),
    ]


def _invalid(message: str, intervals: pd.DataFrame) -> Finding:
    """INVALID, naming the entry events whose interval excludes equal clocks."""
    rows = intervals.loc[(intervals["lo"] > 0.0) | (intervals["hi"] < 0.0), "row"]
    finding = flagged(CHECK, Effect.INVALID, message, "server_events", rows.tolist(), "t")
    return dataclasses.replace(finding, doubts_timing=True)


def _outliers(bound: OffsetBound, intervals: pd.DataFrame) -> Finding:
    assert bound.lo is not None and bound.hi is not None
    off = (intervals["hi"] < bound.lo) | (intervals["lo"] > bound.hi)
    message = (
        f"{bound.outliers} of {bound.pairs} requests on replica {bound.replica} have a first "
        f"server event outside their send -> answer window under the offset the rest agree "
        f"on ({bound.text()}); left out of the estimate (a stamp taken late, or an id reused)"
    )
    return flagged(
        CHECK, Effect.NOTE, message, "server_events", intervals.loc[off, "row"].tolist(), "t"
    )


def _shift(run: RunData, bound: OffsetBound) -> Finding:
    """Put the replica's own rows on the client's clock, and say so."""
    theta = bound.midpoint
    events = run.server_events
    mine = events["replica"].astype(str).eq(bound.replica) & ~events["seq"].lt(0)
    shifted = events.copy()
    shifted.loc[mine, "t"] = shifted.loc[mine, "t"] - theta
    run.server_events = shifted
    ahead = "ahead of" if theta > 0 else "behind"
    message = (
        f"replica {bound.replica}'s clock ran {abs(theta):.3f} s {ahead} the client's (offset "
        f"in {bound.text()}, from {bound.pairs} requests' send -> first server event); its "
        f"{int(mine.sum())} server events were moved by {-theta:+.3f} s before judging "
        f"(error at most {bound.width / 2 * 1000:.0f} ms)"
    )
    return flagged(CHECK, Effect.NOTE, message, "server_events", events.index[mine].tolist(), "t")
