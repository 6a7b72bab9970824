"""The metric registry: named functions from a run's tables to observations a gate judges.

A metric returns one row per observation (column `value`, plus evidence columns such as
`request_id`, `t`, `tenant`, `replica`, `detail`) and how many records it examined; zero
examined records means the run has no data for the gate, which is never a silent pass.
A metric declares its kind — `trend` (a distribution: latencies, shares), `rate` (0/1 per
observation), `count` (one row per violation) or `series` (one value per window) — and gate
files are checked against it. It also declares what its value means to the rules that read
a verdict: `timing` (a time on the run's clocks, which a lagging simulator or a load
generator over its CPU budget makes late, so such a run cannot prove its breach) and `cause`
(the rollback cause its failure points to). Its unit is one of gates/terms.py's
UNIT_SCALES, which says how a threshold's number on it is written (900ms, 0.99 or 99%, 40).
No rule looks at a metric's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gates.rundir import RunData
from gates.terms import KINDS, UNIT_SCALES, Cause, GateFilter, Scale

__all__ = ["EVIDENCE_COLUMNS", "KINDS", "REGISTRY", "Cause", "MetricDef", "Observations", "metric"]

EVIDENCE_COLUMNS = ("request_id", "t", "tenant", "replica", "detail")


@dataclass(slots=True)
class Observations:
    """What a metric saw. Invariant: `frame` has a float column `value`."""

    frame: pd.DataFrame
    n_samples: int
    missing: str | None = None
    notes: list[str] = field(default_factory=list)
    # Observations that could go either way (a breach not shown at the gate's confidence):
    # they keep a passing gate from PASS, and say why.
    unsure: list[str] = field(default_factory=list)

    @classmethod
    def none(cls, why: str) -> Observations:
        return cls(
            frame=pd.DataFrame({"value": pd.Series([], dtype=float)}), n_samples=0, missing=why
        )


MetricFn = Callable[[RunData, GateFilter, Mapping[str, Any]], Observations]


@dataclass(frozen=True, slots=True)
class MetricDef:
    name: str
    fn: MetricFn
    filters: frozenset[str]
    params: Mapping[str, Any]
    unit: str
    description: str
    kind: str
    timing: bool
    cause: Cause
    cause_weight: int = 1
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def compute(self, run: RunData, flt: GateFilter, params: Mapping[str, Any]) -> Observations:
        """The metric over `run`, computed once per (filter, params) and kept in `run.cache`."""
        merged = {**self.params, **params}
        key = ("metric", self.name, flt.model_dump_json(), tuple(sorted(merged.items())))
        if key not in run.cache:
            run.cache[key] = self.fn(run, flt, merged)
        cached: Observations = run.cache[key]
        return cached


REGISTRY: dict[str, MetricDef] = {}


def metric(
    name: str,
    *,
    filters: tuple[str, ...],
    unit: str,
    kind: str,
    timing: bool,
    cause: Cause,
    cause_weight: int = 1,
    params: Mapping[str, Any] | None = None,
    choices: Mapping[str, tuple[str, ...]] | None = None,
) -> Callable[[MetricFn], MetricFn]:
    """Register `fn` as metric `name` of `kind` (trend, rate, count, series); its docstring
    is the description reports show; `choices` lists the allowed values of text parameters.

    `timing`: the value is a time on the run's clocks (seconds), so a run whose timings
    cannot be trusted cannot prove its breach, unless the value is +inf (never answered,
    never released). `cause`: the rollback cause a failure of this metric points to, and
    `cause_weight` how many points of evidence that failure is (1 unless it is direct
    evidence). Both are required, so that no new metric inherits a meaning by omission.
    """
    if kind not in KINDS:
        raise ValueError(f"metric {name!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
    _check_declarations(name, unit, timing, cause, cause_weight)
    _check_unit(name, unit, kind)

    def register(fn: MetricFn) -> MetricFn:
        if name in REGISTRY:
            raise ValueError(f"metric {name!r} registered twice")
        REGISTRY[name] = MetricDef(
            name=name,
            fn=fn,
            filters=frozenset(filters),
            params=dict(params or {}),
            unit=unit,
            kind=kind,
            timing=timing,
            cause=cause,
            cause_weight=cause_weight,
            choices=dict(choices or {}),
            description=(fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else name,
        )
        return fn

    return register


def _check_unit(name: str, unit: str, kind: str) -> None:
    if unit not in UNIT_SCALES:
        raise ValueError(
            f"metric {name!r}: unit {unit!r} is not one of {', '.join(map(repr, UNIT_SCALES))}; "
            "declare one of those, or add the unit to UNIT_SCALES in gates/terms.py with the "
            "scale its thresholds are written in"
        )
    if kind == "rate" and UNIT_SCALES[unit] is not Scale.SHARE:
        # a rate's observations are 0 or 1, and its statistic is the share of ones
        raise ValueError(
            f"metric {name!r}: a rate metric is a share, so its unit is one whose scale is a "
            f"share (such as 'fraction'), got unit {unit!r}"
        )


def _check_declarations(
    name: str, unit: str, timing: object, cause: object, cause_weight: object
) -> None:
    if not isinstance(timing, bool):
        raise ValueError(f"metric {name!r}: timing must be True or False, got {timing!r}")
    if timing and unit != "s":
        # the verdict weighs a timing breach against the run's lag, which is in seconds
        raise ValueError(
            f"metric {name!r}: a timing metric is measured in seconds (unit 's'), got "
            f"unit {unit!r}; convert its values to seconds, or declare timing=False"
        )
    if not isinstance(cause, Cause):
        raise ValueError(
            f"metric {name!r}: cause must be a gates.registry.Cause "
            f"({', '.join(f'Cause.{c.name}' for c in Cause)}), got {cause!r}"
        )
    if not isinstance(cause_weight, int) or isinstance(cause_weight, bool) or cause_weight < 1:
        raise ValueError(
            f"metric {name!r}: cause_weight must be a whole number >= 1, got {cause_weight!r}"
        )
    if cause is Cause.NONE and cause_weight != 1:
        raise ValueError(
            f"metric {name!r}: cause_weight {cause_weight} weighs no cause; "
            "declare the cause it points to, or leave cause_weight out"
        )
