"""Failure rates of a candidate against its baseline, each by the definition of a gate.

A gate that bounds a rate (`rate >= 0.99` of availability, `rate <= 0.01` of timeouts and
disconnects) already says what a failure is: the observation its line counts against, 0
for a rate that must stay high, 1 for one that must stay low. A gate on a timing says it
too: a request that never got its first token, a release that never came, is +inf there.
So each such gate of the gate file, with its own filter and params, gives one rate here,
computed by its own metric (the same observations the verdict judged), and one exact
one-sided test of whether the candidate fails more often (reports/significance.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gates.metrics import REGISTRY
from gates.rundir import RunData
from gates.spec import GateFile, GateSpec
from gates.terms import GateFilter
from reports.significance import ALPHA, worse_rate_p

# The practical margin of a censored latency: a request that never got its first token went
# unanswered, to its user as to the availability gate, so it gets that gate's allowance (one
# request in a hundred) rather than the percentile's (p(95) tolerates five in a hundred over
# its line, which would let a candidate time out on 4% of critical requests unremarked).
CENSORED_MARGIN = 0.01


@dataclass(frozen=True, slots=True)
class Failure:
    """What one gate counts as a failure, and the rise its gate tolerates."""

    what: str
    hit: Callable[[np.ndarray], np.ndarray]
    margin: float


@dataclass(slots=True)
class RateTest:
    """One gate's failure rate in both runs and the exact test that the candidate's is higher.

    `p_adjusted` is Holm's over every test of the comparison; a rate that cannot differ (no
    failure in either run, or nothing but failures) stays out of that family (`in_family`)."""

    gate: str
    metric: str
    failure: str
    scope: str
    key: bool
    margin: float
    failed_candidate: int
    n_candidate: int
    failed_baseline: int
    n_baseline: int
    p_value: float
    test: str
    p_adjusted: float = math.nan
    in_family: bool = True

    @property
    def rate_candidate(self) -> float:
        return self.failed_candidate / self.n_candidate

    @property
    def rate_baseline(self) -> float:
        return self.failed_baseline / self.n_baseline

    @property
    def change(self) -> float:
        return self.rate_candidate - self.rate_baseline

    @property
    def worse(self) -> bool:
        """Newly failing: significantly higher after adjustment, by more than the margin."""
        return self.p_adjusted < ALPHA and self.change > self.margin

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "rate_candidate": self.rate_candidate,
            "rate_baseline": self.rate_baseline,
            "change": self.change,
            "worse": self.worse,
        }

    def text(self) -> str:
        return (
            f"{self.gate} ({self.scope}): {self.failed_candidate} of {self.n_candidate} "
            f"failed ({self.rate_candidate:.2%}) vs {self.failed_baseline} of "
            f"{self.n_baseline} ({self.rate_baseline:.2%}), a failure being {self.failure}; "
            f"{100 * self.change:+.2f} pp, beyond the {100 * self.margin:.2g} pp margin, "
            f"p={self.p_value:.2g} (Holm {self.p_adjusted:.2g})"
        )


def failure_of(gate: GateSpec) -> Failure | None:
    """The failure `gate` counts, or None for a gate that bounds no failure rate."""
    definition, line = REGISTRY[gate.metric], gate.pass_
    kind = definition.kind
    if kind == "rate" and line.statistic == "rate" and line.op in (">", ">="):
        return Failure(f"0 (`{line.text}`)", lambda v: v == 0.0, 1.0 - line.value)
    if kind == "rate" and line.statistic == "rate" and line.op in ("<", "<="):
        return Failure(f"1 (`{line.text}`)", lambda v: v == 1.0, line.value)
    # +inf is a timing that never came (gates/registry.py), not a value of any other trend
    if kind == "trend" and definition.timing and line.higher_is_worse:
        return Failure("no value, +inf", np.isposinf, CENSORED_MARGIN)
    return None


def rate_tests(
    candidate: RunData, baseline: RunData, gate_file: GateFile, gates: list[dict[str, Any]]
) -> list[RateTest]:
    """One test per failure rate the gate file bounds, over the gates both runs judged with
    data (`gates`: reports.compare.gate_pairs); gates that share metric, filter and params
    share a rate, named after the first."""
    with_data = {g["id"] for g in gates if None not in (g["candidate_value"], g["baseline_value"])}
    tests: list[RateTest] = []
    seen: set[tuple[Any, ...]] = set()
    for gate in gate_file.gates:
        failure = failure_of(gate)
        if failure is None or gate.id not in with_data:
            continue
        key = (gate.metric, gate.filter.model_dump_json(), tuple(sorted(gate.params.items())))
        if (*key, failure.what) in seen:
            continue
        seen.add((*key, failure.what))
        (fc, nc), (fb, nb) = _count(candidate, gate, failure), _count(baseline, gate, failure)
        if nc == 0 or nb == 0:
            continue
        p_value, test = worse_rate_p(fc, nc, fb, nb)
        tests.append(
            RateTest(
                gate=gate.id,
                metric=gate.metric,
                failure=failure.what,
                scope=describe(gate.filter),
                key=gate.key,
                margin=failure.margin,
                failed_candidate=fc,
                n_candidate=nc,
                failed_baseline=fb,
                n_baseline=nb,
                p_value=p_value,
                test=test,
                in_family=test != "none",
            )
        )
    return tests


def _count(run: RunData, gate: GateSpec, failure: Failure) -> tuple[int, int]:
    """(failures, observations) of `gate`'s metric over `run`: what its verdict judged (the
    registry keeps each computation on the run, so this reads it again for free)."""
    obs = REGISTRY[gate.metric].compute(run, gate.filter, gate.params)
    values = obs.frame["value"].to_numpy(dtype=float)
    return int(np.count_nonzero(failure.hit(values))), len(values)


def describe(flt: GateFilter) -> str:
    parts = [" ".join(v) for v in (flt.priority, flt.traffic_class, flt.tenant) if v]
    if flt.window != "all":
        parts.append(f"window {flt.window}")
    return ", ".join(parts) or "all"
