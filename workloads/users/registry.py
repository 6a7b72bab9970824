"""The traffic-class registry: every user class that names itself, and what a plan may set on it.

A `KvgateUser` subclass that sets `name` in its own body registers itself here as it is
defined, as Locust finds its users by subclassing; nothing else lists the classes. What a
plan may set on a class (its attribute model) is read from the class's annotations, so a
new attribute is declared once, where the class uses it.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Final, get_args, get_origin

from locust import between, constant
from pydantic import TypeAdapter, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

if TYPE_CHECKING:
    from workloads.users.base import KvgateUser

NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"  # a plan key
# Attributes a plan may not set, and why: the harness sets them, or they name the class.
NOT_FROM_PLANS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "dialect": "the target decides what requests carry (target.kind, target.extensions), "
        "not a class",
        "name": "a class is named by its plan key, and `base` names the class it is built from",
    }
)
# Locust's wait_time is a function; a plan gives seconds (2) or a range ([0.5, 2]).
WAIT_TIME: Final = "wait_time"
_WAIT_TIME_TYPE = float | tuple[float, float]
_WAIT_TIME_FORM: Final = TypeAdapter(_WAIT_TIME_TYPE)

_classes: dict[str, type[KvgateUser]] = {}
# Plan name -> its class, in the order the classes were defined (a read-only live view).
CLASSES: Final[Mapping[str, type[KvgateUser]]] = MappingProxyType(_classes)


def register(cls: type[KvgateUser]) -> None:
    """Adds a class that set its own `name`. A class defined again under the same module and
    name (a reload) replaces its older self; any other class that takes a registered name is
    an error, as is a class that cannot run or says nothing of what its records carry."""
    from workloads.users.base import KvgateUser

    name, where = cls.name, _where(cls)
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise TypeError(f"{where}: name {name!r} is not a plan key; use letters, digits and _")
    if cls.abstract:
        raise TypeError(f"{where}: a named traffic class is one a plan runs; it cannot be abstract")
    own = cls.__mro__[: cls.__mro__.index(KvgateUser)]  # the classes below KvgateUser
    if not any("traffic_class" in vars(k) for k in own):
        raise TypeError(
            f"{where}: set traffic_class, what its records carry (one of "
            "contract.TRAFFIC_CLASSES, or a new value added there)"
        )
    known = _classes.get(name)
    if known is not None and _where(known) != where:
        raise TypeError(
            f"{where}: traffic class {name!r} is already {_where(known)}; "
            "give one of them another name"
        )
    if "label" not in vars(cls):
        cls.label = name
    _classes[name] = cls


def attribute_types(cls: type[KvgateUser]) -> Mapping[str, Any]:
    """What a plan may set on `cls`, and the type of each: every attribute annotated on
    KvgateUser and the classes down to `cls` (ClassVar unwrapped), less those a plan may not
    set, plus Locust's `wait_time`."""
    return _attribute_model(cls)[0]


def configure(cls: type[KvgateUser], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The class attributes a plan's `attributes` set on `cls`, each validated against its
    declared type as YAML wrote it (a list stands for a tuple; "3" is no int) and converted
    (wait_time becomes Locust's function); raises pydantic's ValidationError naming every
    attribute `attribute_errors` finds."""
    values, errors = _convert(cls, overrides, ())
    if errors:
        raise ValidationError.from_exception_data(cls.__name__, errors)
    return values


def attribute_errors(
    cls: type[KvgateUser], overrides: Mapping[str, Any], loc: tuple[str | int, ...]
) -> list[InitErrorDetails]:
    """One pydantic error per attribute of `overrides` that `cls` does not declare, that is
    not a plan's to set, or whose value is not of its declared type; each at `loc` plus the
    attribute's path, so a plan's validation names each one's YAML path."""
    return _convert(cls, overrides, loc)[1]


def _convert(
    cls: type[KvgateUser], overrides: Mapping[str, Any], loc: tuple[str | int, ...]
) -> tuple[dict[str, Any], list[InitErrorDetails]]:
    types, adapters = _attribute_model(cls)
    values: dict[str, Any] = {}
    errors: list[InitErrorDetails] = []

    def problem(key: str, kind: str, message: str, value: Any, **context: str) -> None:
        error = PydanticCustomError(kind, message, context or None)
        errors.append(InitErrorDetails(type=error, loc=(*loc, key), input=value))

    for key, value in overrides.items():
        if key in NOT_FROM_PLANS:
            problem(key, "attribute_not_from_plans", "{why}", value, why=NOT_FROM_PLANS[key])
            continue
        if key not in types:
            message = "{cls} has no such attribute; known: {known}"
            known = ", ".join(types)
            problem(key, "unknown_attribute", message, value, cls=str(cls.name), known=known)
            continue
        try:
            if key == WAIT_TIME:
                values[key] = _wait_time(value)
            else:
                values[key] = _from_yaml(adapters[key], value)
        except TypeError:  # not JSON data: a YAML date, a set
            problem(key, "not_yaml_data", "give a number, string, boolean, list or mapping", value)
        except ValidationError as exc:
            if key == WAIT_TIME:
                problem(key, "wait_time", "give seconds (2) or a range ([0.5, 2])", value)
                continue
            declared = _type_text(types[key])
            for err in exc.errors():
                context = {"msg": err["msg"], "declared": declared}
                error = PydanticCustomError(
                    err["type"], "{msg} (the attribute is {declared})", context
                )
                path = (*loc, key, *err["loc"])
                errors.append(InitErrorDetails(type=error, loc=path, input=err["input"]))
    return values, errors


def _from_yaml(adapter: TypeAdapter[Any], value: Any) -> Any:
    """`value` validated as YAML wrote it: JSON's types are YAML's, and strict JSON takes an
    array for a tuple and no "3" for 3."""
    return adapter.validate_json(json.dumps(value), strict=True)


def _wait_time(value: Any) -> Any:
    seconds = _from_yaml(_WAIT_TIME_FORM, value)
    return between(*seconds) if isinstance(seconds, tuple) else constant(seconds)


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@functools.cache
def _attribute_model(
    cls: type[KvgateUser],
) -> tuple[Mapping[str, Any], Mapping[str, TypeAdapter[Any]]]:
    from workloads.users.base import KvgateUser

    types: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if not issubclass(klass, KvgateUser):
            continue
        try:
            annotations = inspect.get_annotations(klass, eval_str=True)
        except Exception as exc:
            raise TypeError(
                f"{_where(klass)}: its annotations cannot be evaluated ({exc}); import at run "
                "time every name they use: they are what a plan may set on the class"
            ) from exc
        for key, annotation in annotations.items():
            if key.startswith("_") or key in NOT_FROM_PLANS:
                continue
            types[key] = _declared(annotation)
    types[WAIT_TIME] = _WAIT_TIME_TYPE
    ordered = dict(sorted(types.items()))
    adapters = {key: TypeAdapter(t) for key, t in ordered.items() if key != WAIT_TIME}
    return MappingProxyType(ordered), MappingProxyType(adapters)


def _declared(annotation: Any) -> Any:
    """The type an annotation declares: `ClassVar[int]` declares int."""
    origin: object = get_origin(annotation)
    return get_args(annotation)[0] if origin is ClassVar else annotation


def _type_text(annotation: Any) -> str:
    if isinstance(annotation, type) and not get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("pathlib.", "")
