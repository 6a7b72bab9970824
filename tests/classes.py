"""Subclasses made at run time (as a plan's attributes make them), typed as their base: the
three-argument `type()` gives back a plain `type`, which would leave every use unchecked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar, cast

T = TypeVar("T")


def subclass(name: str, base: type[T], attrs: Mapping[str, object]) -> type[T]:
    """`base`'s subclass `name`, with `attrs` as its class attributes."""
    return cast(type[T], type(name, (base,), dict(attrs)))
