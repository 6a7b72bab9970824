"""The metric registry: named functions from a run's tables to observations a gate judges.

A metric returns one row per observation (column `value`, plus evidence columns such as
`request_id`, `t`, `tenant`, `replica`, `detail`) and how many records it examined; zero
examined records means the run has no data for the gate, which is never a silent pass.
A metric declares its kind — `trend` (a distribution: latencies, shares), `rate` (0/1 per
observation) or `count` (one row per violation) — and gate files are checked against it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gates.rundir import RunData
from gates.spec import GateFilter

KINDS = ("trend", "rate", "count", "series")
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
    kind: str = "trend"
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
    params: Mapping[str, Any] | None = None,
    choices: Mapping[str, tuple[str, ...]] | None = None,
) -> Callable[[MetricFn], MetricFn]:
    """Register `fn` as metric `name` of `kind` (trend, rate, count); its docstring is the
    description reports show; `choices` lists the allowed values of text parameters."""
    if kind not in KINDS:
        raise ValueError(f"metric {name!r}: kind {kind!r} is not one of {', '.join(KINDS)}")

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
            choices=dict(choices or {}),
            description=(fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else name,
        )
        return fn

    return register
