"""Locust user classes, one per traffic class, found by subclassing as Locust finds its users.

Importing this package imports every module in it; each `KvgateUser` subclass that sets its
own `name` registers itself as it is defined (workloads/users/registry.py). `USER_CLASSES`
maps a plan's class name to its user class; records carry the coarser `traffic_class` (both
short Q&A variants record `short_qa`).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Final

from workloads.users import registry
from workloads.users.base import KvgateUser

# Plan name -> user class: every registered class, in the order the classes were defined.
USER_CLASSES: Final[Mapping[str, type[KvgateUser]]] = registry.CLASSES


def discover() -> Mapping[str, type[KvgateUser]]:
    """Imports every module of this package's path (each registers its classes as it loads)
    and returns the registry; a module imported before is not imported again."""
    for module in pkgutil.iter_modules(__path__, f"{__name__}."):
        importlib.import_module(module.name)
    return USER_CLASSES


discover()

__all__ = ["USER_CLASSES", "KvgateUser", "discover"]
