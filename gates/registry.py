"""The metric registry: named functions from a run's tables to observations a gate judges.

A metric returns one row per observation (column `value`, plus evidence columns such as
`request_id`, `t`, `tenant`, `replica`, `detail`) and how many records it examined; zero
examined records means the run has no data for the gate, which is never a silent pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gates.rundir import RunData
from gates.spec import GateFilter

EVIDENCE_COLUMNS = ("request_id", "t", "tenant", "replica", "detail")


@dataclass(slots=True)
class Observations:
    """What a metric saw. Invariant: `frame` has a float column `value`."""

    frame: pd.DataFrame
    n_samples: int
    missing: str | None = None
    notes: list[str] = field(default_factory=list)

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
    params: Mapping[str, Any] | None = None,
) -> Callable[[MetricFn], MetricFn]:
    """Register `fn` as metric `name`; its docstring is the description reports show."""

    def register(fn: MetricFn) -> MetricFn:
        if name in REGISTRY:
            raise ValueError(f"metric {name!r} registered twice")
        REGISTRY[name] = MetricDef(
            name=name,
            fn=fn,
            filters=frozenset(filters),
            params=dict(params or {}),
            unit=unit,
            description=(fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else name,
        )
        return fn

    return register
