"""The metric registry with every built-in metric registered (import this, not the parts).

Every module `gates/metrics_*.py` is imported here, in name order, and its `@metric`
functions register themselves: a new metric module is picked up without a line elsewhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import gates
from gates.registry import REGISTRY, Cause, MetricDef, Observations

MODULE_PREFIX = "metrics_"


def _discover() -> tuple[ModuleType, ...]:
    names = sorted(m.name for m in pkgutil.iter_modules(gates.__path__))
    return tuple(
        importlib.import_module(f"gates.{name}") for name in names if name.startswith(MODULE_PREFIX)
    )


MODULES = _discover()

__all__ = ["MODULES", "REGISTRY", "Cause", "MetricDef", "Observations"]
