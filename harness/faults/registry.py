"""Fault kind -> its plan model and its action, built from the modules of
harness/faults/kinds/, each of which registers itself (`@fault_kind`); and the plan's union
of fault models, discriminated on `kind`. Adding a kind is adding one module there.

Importing this imports every kind module, so it stays light: the plan loads it before
Locust patches sockets, and no kind may import harness.plan or open anything at import.
"""

from __future__ import annotations

import functools
import importlib
import operator
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

import harness.faults.kinds
from harness.faults.base import KINDS, ActionFactory, FaultKind, FaultSpec


def discover() -> Mapping[str, FaultKind]:
    """Import every module of harness.faults.kinds (each registers its kinds as it loads)."""
    package = harness.faults.kinds
    for module in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
        importlib.import_module(module.name)
    return MappingProxyType(dict(KINDS))


REGISTRY: Mapping[str, FaultKind] = discover()
ACTIONS: Mapping[str, ActionFactory] = MappingProxyType(
    {name: kind.action for name, kind in REGISTRY.items()}
)
FAULT_MODELS: Mapping[str, type[FaultSpec]] = MappingProxyType(
    {name: kind.spec for name, kind in REGISTRY.items()}
)

if TYPE_CHECKING:
    Fault = FaultSpec  # to a type checker, a plan's fault is any kind's model
else:
    _models: Any = functools.reduce(operator.or_, FAULT_MODELS.values())
    Fault = Annotated[_models, Field(discriminator="kind")]
