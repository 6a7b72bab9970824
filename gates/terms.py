"""The terms gates are written in: the one-line threshold (`p(95) <= 900ms`), the filter, the
kinds of metric with the statistics each is judged by, the units a metric may be measured in
with the numbers a threshold on each takes, and the causes a metric may point to.

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


class Scale(StrEnum):
    """What a threshold's number measures, and so how it is written (`misfit`)."""

    TIME = "time"  # seconds; written with ms or s, never bare
    SHARE = "share"  # 1 is the whole; written bare (0.99) or as a percentage (99%)
    AMOUNT = "amount"  # so many of the unit (requests, tokens, MB); written bare


# The units a metric may declare (gates/registry.py), each with its scale. A unit is what a
# threshold's number is in, so it is declared from this list, where a typo is refused,
# rather than as free text that a rule would have to guess at.
UNIT_SCALES = {
    "s": Scale.TIME,
    "fraction": Scale.SHARE,
    "share": Scale.SHARE,
    "share of capacity": Scale.SHARE,
    "count": Scale.AMOUNT,
    "MB": Scale.AMOUNT,
    "tokens": Scale.AMOUNT,
    "users": Scale.AMOUNT,
    "requests/s": Scale.AMOUNT,
}
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
    # The number and its unit as written ("900", "ms"), for the checks that say how to write
    # it instead; `value` is the number in the metric's own terms (seconds, fractions).
    number: str = ""
    unit: str = ""

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, data: Any) -> Any:
        if not isinstance(data, str):
            if isinstance(data, dict):
                return data
            raise ValueError(f"a threshold is a string like 'p(95) <= 900ms', found {data!r}")
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
            "number": match["num"],
            "unit": match["unit"] or "",
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


def statistic_scale(statistic: str, unit: str) -> Scale:
    """What a statistic of a metric in `unit` measures. `count` counts observations, `rate`
    is a share of them, and `sum` adds their values up (a sum of 0/1 shares is a number of
    ones); every other statistic is in the metric's unit (`slope`: that unit per hour)."""
    if statistic == "count":
        return Scale.AMOUNT
    if statistic == "rate":
        return Scale.SHARE
    scale = UNIT_SCALES[unit]
    return Scale.AMOUNT if statistic == "sum" and scale is Scale.SHARE else scale


def misfit(threshold: Threshold, metric: str, unit: str) -> str | None:
    """Why `threshold` cannot be a line on `metric`, measured in `unit`, with what would fit
    (None: it fits). A time takes ms or s and never a bare number: k6 reads a bare number
    as milliseconds, the metric is in seconds, and a line must not mean a thousand times
    what its author thinks. A share takes a bare number between 0 and 1 or a percentage;
    an amount takes a bare number, not below 0. A slope's number is a change per hour,
    which may be of any sign or size, so only its unit is checked."""
    scale = statistic_scale(threshold.statistic, unit)
    if scale is Scale.TIME:
        return _time_misfit(threshold, metric)
    if scale is Scale.SHARE:
        return _share_misfit(threshold, metric, unit)
    return _amount_misfit(threshold, metric, unit)


def _time_misfit(threshold: Threshold, metric: str) -> str | None:
    line = f"{threshold.label} {threshold.op}"
    if threshold.unit == "":
        return (
            f"{metric} is in seconds, and a bare number is ambiguous (k6 reads it as "
            f"milliseconds): write its unit, `{line} {threshold.number}ms` or "
            f"`{line} {threshold.number}s`"
        )
    if threshold.unit == "%":
        return (
            f"{metric} is in seconds, not a share: write ms or s, as in `{line} 900ms` or "
            f"`{line} 0.9s`"
        )
    return None


def _share_misfit(threshold: Threshold, metric: str, unit: str) -> str | None:
    if threshold.statistic == "rate":
        what, within = "a rate is a share between 0 and 1", 0 <= threshold.value <= 1
    else:  # a share's statistic may be a difference of shares (memory_return), so signed
        what = f"{metric} is in {unit}, a share where 1 is the whole"
        within = abs(threshold.value) <= 1
    if threshold.unit in ("ms", "s") or (threshold.statistic != "slope" and not within):
        return f"{what}: write {_share_forms(threshold)}"
    return None


def _amount_misfit(threshold: Threshold, metric: str, unit: str) -> str | None:
    line = f"{threshold.label} {threshold.op}"
    if threshold.statistic == "count":
        what = f"count (how many observations {metric} has)"
    elif threshold.statistic == "sum" and UNIT_SCALES[unit] is Scale.SHARE:
        what = f"sum of {metric} (how many of its observations are 1)"
    else:
        what = f"{metric} ({unit})"
    if threshold.unit:
        return f"{what} is a plain number: write it bare, `{line} {threshold.number}`"
    if threshold.statistic != "slope" and threshold.value < 0:
        return f"{what} is never below 0: write a number >= 0, as in `{line} 0`"
    return None


def _share_forms(threshold: Threshold) -> str:
    """The share the author most likely meant, written both ways: `rate >= 99` reads as
    99%, `rate >= 0.99s` as 0.99; a number no share reading fits gets an example."""
    line = f"{threshold.label} {threshold.op}"
    number = abs(Decimal(threshold.number))
    signed = threshold.value < 0 and threshold.statistic != "rate"
    sign = "-" if signed else ""
    if threshold.unit in ("", "ms", "s") and number <= 1:
        bare, percent = number, number * 100
    elif number <= 100:
        bare, percent = number / 100, number
    else:
        sign, bare, percent = "", Decimal("0.99"), Decimal(99)
    return f"`{line} {sign}{_plain(bare)}` or `{line} {sign}{_plain(percent)}%`"


def _plain(number: Decimal) -> str:
    return format(number.normalize(), "f")


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
