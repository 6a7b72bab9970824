"""The terms gates are written in: the one-line threshold (`p(95) <= 900ms`), the filter, the
kinds of metric with the statistics each is judged by, and the causes a metric may point to.

The metric registry, the gate spec and the verdict all speak these terms, so this module
imports nothing of gates: any of them may import it, and no import loop can run through it.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from decimal import Decimal
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

import contract

STATISTICS = ("count", "rate", "max", "min", "mean", "sum", "slope", "p(N)")
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}
UNITS = {"": Decimal(1), "s": Decimal(1), "ms": Decimal("0.001"), "%": Decimal("0.01")}
# Which statistics each kind of metric can be judged by: a rate is a share of 0/1
# observations, a trend a distribution of values, a count a list of violations.
KIND_STATISTICS = {
    "trend": ("p", "mean", "max", "min", "count"),
    "rate": ("rate", "count", "sum"),
    "count": ("count", "sum", "max"),
    # values over time (one per window): judged by their fitted slope, in units per hour
    "series": ("slope", "max", "mean"),
}
KINDS = tuple(KIND_STATISTICS)
_THRESHOLD = re.compile(
    r"^\s*(?P<stat>count|rate|max|min|mean|sum|slope|p\(\s*(?P<q>\d+(?:\.\d+)?)\s*\))\s*"
    r"(?P<op><=|>=|==|!=|<|>)\s*(?P<num>[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(?P<unit>ms|s|%)?\s*$"
)
FIXED_WINDOWS = ("all", "stress", "idle_before", "after_load", "after_fault", "during_fault")
_WINDOW = re.compile(
    r"^(all|stress|idle_before|after_load|after_fault|during_fault|phase:[\w.-]+)$"
)


class Threshold(BaseModel):
    """`STAT OP NUMBER[unit]`; `ms` and `%` scale the number to seconds and fractions."""

    model_config = ConfigDict(frozen=True)
    statistic: str
    quantile: float | None = None
    op: str
    value: float
    text: str

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, data: Any) -> Any:
        if not isinstance(data, str):
            if isinstance(data, dict):
                return data
            raise ValueError(f"a threshold is a string like 'p(95) <= 0.9', found {data!r}")
        match = _THRESHOLD.match(data)
        if match is None:
            raise ValueError(
                f"threshold {data!r} is not 'STAT OP NUMBER[ms|s|%]'; STAT is one of "
                f"{', '.join(STATISTICS)}, OP one of {', '.join(OPERATORS)}"
            )
        quantile = float(match["q"]) if match["q"] is not None else None
        if quantile is not None and not 0 <= quantile <= 100:
            raise ValueError(f"threshold {data!r}: the percentile must be within 0..100")
        # Decimal, so "95%" is exactly the float 0.95 and 190 of 200 meets `rate >= 95%`.
        value = float(Decimal(match["num"]) * UNITS[match["unit"] or ""])
        stat = "p" if quantile is not None else match["stat"]
        return {
            "statistic": stat,
            "quantile": quantile,
            "op": match["op"],
            "value": value,
            "text": data.strip(),
        }

    @property
    def label(self) -> str:
        return f"p({self.quantile:g})" if self.statistic == "p" else self.statistic

    def holds(self, observed: float) -> bool:
        if math.isnan(observed):
            return False
        return OPERATORS[self.op](observed, self.value)

    @property
    def higher_is_worse(self) -> bool:
        """Whether larger observations move toward a breach (for picking the worst evidence)."""
        return self.op in ("<", "<=", "==")


class GateFilter(BaseModel):
    """Which records a gate looks at; `window` is a named time window of the run."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    traffic_class: list[contract.TrafficClassName] | None = None
    priority: list[contract.PriorityName] | None = None
    tenant: list[str] | None = None
    window: str = "all"

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        if not _WINDOW.match(value):
            raise ValueError(
                f"window {value!r} is not one of {', '.join(FIXED_WINDOWS)} or 'phase:NAME'"
            )
        return value

    def used_fields(self) -> set[str]:
        used = {name for name in ("traffic_class", "priority", "tenant") if getattr(self, name)}
        if self.window != "all":
            used.add("window")
        return used


class Cause(StrEnum):
    """What a gate's failure points to when a candidate is compared with its baseline
    (reports/decide.py names the likeliest). Each metric declares one (gates/registry.py);
    NONE: its failure says nothing about why."""

    NONE = "none"
    ESTIMATION_BIAS = "estimation_bias"
    PRIORITY_RULES = "priority_rules"
    RELEASE_DEFECT = "release_defect"

    @property
    def description(self) -> str:
        return _CAUSE_TEXT[self]


_CAUSE_TEXT = {
    Cause.NONE: "no cause in particular",
    Cause.ESTIMATION_BIAS: "estimation bias (reservations do not match what requests use)",
    Cause.PRIORITY_RULES: "priority rules (who gets rejected or served first)",
    Cause.RELEASE_DEFECT: "a runtime release defect (blocks freed late or held after finish)",
}
