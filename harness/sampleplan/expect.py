"""What each gate of a plan's gate file needs and what the plan is expected to give it.

Needed: the samples a PASS needs on a healthy system, by the same rules as the verdict
(gates/estimate.py's `healthy_needs_n`). Expected: the observations the gate's metric will
count over the load, from the traffic model (harness/sampleplan/traffic.py) for the metrics
that count requests, from the plan itself for those that count its faults or phases, and
"unknown" for those that count what only the server decides (its preemptions, its
refusals). A previous run's measured counts replace the model's (calibrate.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from contract.servers import DATA_KINDS, ServerProfile
from gates.estimate import healthy_needs_n
from gates.spec import GateSpec
from harness.sampleplan.traffic import TrafficModel, Window
from workloads.users.base import RequestKind

# An estimate this close above the need is no promise: an assumed latency a little off, and
# a healthy run reads INVALID. The table says so.
TIGHT_MARGIN = 1.25


class Source(StrEnum):
    """Where an expected count comes from (the table's footnote letter)."""

    PLAN = "plan"  # counted from the plan: its faults, its phases
    ASSUMED = "assumed"  # the traffic model, with assumed latencies
    MEASURED = "measured"  # a previous run's counts (--from RUN_DIR)
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Expected:
    """Observations a gate is expected to get over the load: `n` in all, `rate_s` a second
    of load when they accrue with time (None for a count the plan fixes, or unknown)."""

    n: float | None
    rate_s: float | None
    source: Source
    basis: str

    @classmethod
    def unknown(cls, why: str) -> Expected:
        return cls(None, None, Source.UNKNOWN, why)


class Reach(StrEnum):
    ENOUGH = "enough"
    TIGHT = "tight"  # enough by the estimate, within TIGHT_MARGIN of the need
    SHORT = "short"
    UNKNOWN = "unknown"
    NA = "n/a"


@dataclass(frozen=True, slots=True)
class GateNeed:
    """One gate: the samples it needs, those it is expected to get, and whether they meet."""

    gate: str
    key: bool
    blocking: bool
    line: str
    needed: int | None
    expected: Expected
    not_applicable: str | None = None

    @property
    def reach(self) -> Reach:
        if self.not_applicable is not None:
            return Reach.NA
        n = self.expected.n
        if self.needed is None or n is None:
            return Reach.UNKNOWN
        if n < self.needed:
            return Reach.SHORT
        estimated = self.expected.source is not Source.PLAN  # a count the plan fixes is exact
        return Reach.TIGHT if estimated and n < self.needed * TIGHT_MARGIN else Reach.ENOUGH

    @property
    def time_needed_s(self) -> float | None:
        """Seconds of load the need takes at the expected rate (None: not a matter of time,
        or unknown; inf: nothing the gate counts is sent)."""
        rate = self.expected.rate_s
        if self.needed is None or rate is None:
            return None
        return self.needed / rate if rate > 0 else math.inf


def needed(gate: GateSpec, anytime: bool = False) -> int | None:
    """The samples a healthy run needs: for the verdict's fixed-n interval, or (`anytime`,
    a load that runs until decided) for the anytime-valid bound the stop rule waits for."""
    return healthy_needs_n(gate.pass_, gate.min_samples, gate.confidence, anytime=anytime)


def not_applicable(gate: GateSpec, given: frozenset[str], profile: ServerProfile) -> str | None:
    """Why the gate cannot apply to the plan's target, or None. `given` are the kinds of
    data the target gives (its profile's, and those kvgate's own recorder adds): a gate that
    needs another is N/A, as the verdict finds it against a run that shows no more."""
    if gate.skip:
        return f"left out by the gate file: {gate.skip}"
    for need in gate.needs:
        options = need.split("|")
        if any(kind in given for kind in options):
            continue
        lacking = [profile.lacks[kind] for kind in options if kind in profile.lacks]
        what = " or ".join(DATA_KINDS[kind] for kind in options)
        return "; ".join(lacking) or (
            f"needs {what}, which {profile.title} targets do not give ({profile.source_file})"
        )
    return None


def expected(traffic: TrafficModel, gate: GateSpec) -> Expected:
    """What the gate's metric is expected to count over the plan's load."""
    estimator = ESTIMATORS.get(gate.metric)
    if estimator is not None:
        return estimator(traffic, gate)
    counted = SERVER_DECIDES.get(gate.metric, f"what the {gate.metric} metric counts")
    return Expected.unknown(f"counts {counted}, which no plan can foresee: measure it with --from")


def _window(traffic: TrafficModel, window: str, first_fault_s: float | None) -> Window | str:
    """A gate filter's window as seconds of the load, or why it cannot be said."""
    end = traffic.end_s
    if window in ("all", "stress"):
        return [(0.0, end)]
    if window.startswith("phase:"):
        name = window.split(":", 1)[1]
        return [(s.t0, s.t0 + s.seconds) for s in traffic.spans if s.name == name]
    if window == "after_fault" and first_fault_s is not None:
        return [(first_fault_s, end)]
    return f"its window {window!r} depends on how long faults last"


def _requests(
    what: str, chosen: Callable[[RequestKind], bool]
) -> Callable[[TrafficModel, GateSpec], Expected]:
    """An estimator for a metric with one observation per request of the kinds `chosen`
    picks (and the gate's filter)."""

    def estimate(traffic: TrafficModel, gate: GateSpec) -> Expected:
        flt = gate.filter
        window = _window(traffic, flt.window, traffic.first_fault_s)
        if isinstance(window, str):
            return Expected.unknown(window)

        def picked(kind: RequestKind) -> bool:
            return (
                chosen(kind)
                and (flt.traffic_class is None or kind.traffic_class in flt.traffic_class)
                and (flt.priority is None or kind.priority in flt.priority)
                and (flt.tenant is None or kind.tenant in flt.tenant)
            )

        n = traffic.requests(picked, window)
        if n is None:
            return Expected.unknown(
                f"a class it counts has a wait time nobody can average ({what})"
            )
        seconds = sum(b - a for a, b in window)
        return Expected(n, n / seconds if seconds > 0 else 0.0, Source.ASSUMED, what)

    return estimate


def _tenant_shares(traffic: TrafficModel, gate: GateSpec) -> Expected:
    if traffic.scrape_interval_s is None:
        return Expected.unknown("the Prometheus sampler is off, so only server events show shares")
    tenants = len(traffic.tenants()) if gate.filter.tenant is None else len(gate.filter.tenant)
    rate = traffic.replicas * max(tenants, 1) / traffic.scrape_interval_s
    what = f"a share per replica and tenant ({tenants}) every {traffic.scrape_interval_s:g} s"
    return Expected(rate * traffic.load_s, rate, Source.ASSUMED, what)


def _kills(traffic: TrafficModel, gate: GateSpec) -> Expected:
    return Expected(float(traffic.kills), None, Source.PLAN, "replica kills among its faults")


def _phases(traffic: TrafficModel, gate: GateSpec) -> Expected:
    n = traffic.phases.get("peak", 0) + traffic.phases.get("trough", 0)
    return Expected(float(n), None, Source.PLAN, "peaks and troughs of its load shape")


def _not_cancelled(kind: RequestKind) -> bool:
    return not kind.cancelled


ESTIMATORS: dict[str, Callable[[TrafficModel, GateSpec], Expected]] = {
    "availability": _requests(
        "requests the client does not cancel, security probes left out",
        lambda k: not k.cancelled and k.probe is None,
    ),
    "timeouts_disconnects": _requests(
        "requests the client does not cancel, security probes left out",
        lambda k: not k.cancelled and k.probe is None,
    ),
    "ttft": _requests(
        "requests that stream a first token",
        lambda k: not k.cancelled or (k.cancel_after_tokens or 0) > 0,
    ),
    "e2e": _requests("requests the client does not cancel", _not_cancelled),
    "outcome_rate": _requests("requests", lambda k: True),
    "cancel_release_latency": _requests(
        "cancelled requests, each taken to hold a reservation", lambda k: k.cancelled
    ),
    "oom_events": _requests("requests (server events and samples add more)", lambda k: True),
    "priority_escalations": _requests("escalation probes", lambda k: k.probe == "escalation"),
    "cross_tenant_prefix_hits": _requests(
        "private-prefix probe groups", lambda k: k.probe == "prefix_probe"
    ),
    "tenant_pool_share": _tenant_shares,
    "failover_integrity": _kills,
    "batch_peak_trough": _phases,
}
# What the metrics that no plan can estimate count: the server's choices under the load.
SERVER_DECIDES = {
    "preempted_completion": "the requests the server preempts",
    "critical_preemptions": "the preemptions the server makes",
    "explicit_refusal": "the requests the server refuses or fails",
    "ttft_under_pressure": "the requests sent while the server queues lower-priority work",
}
