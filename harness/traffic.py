"""The traffic mix of a plan as Locust classes: user classes with overrides, and the load shape.

Every plan class becomes a subclass of the workloads' user class, named after the plan key
(Locust's master and workers match classes by name, so both sides build the same names).
Overrides are plain class attributes; the workloads' classes are configured that way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from locust import LoadTestShape, User, between, constant

from harness.plan import ExternalTarget, Plan, ReferenceTarget

log = logging.getLogger(__name__)
PROMPT_SIZES = ("prompt_tokens", "prefix_tokens")  # what traffic.prompt_scale multiplies


class TrafficError(ValueError):
    """The plan's traffic does not fit the workloads package (unknown attribute, class)."""


def workload_classes() -> dict[str, type[User]]:
    from workloads.users import USER_CLASSES

    return dict(USER_CLASSES)


def workload_shapes() -> dict[str, type[LoadTestShape]]:
    from workloads import shapes

    return {
        "step_ramp": shapes.StepRampShape,
        "soak": shapes.SoakShape,
        "peak_trough": shapes.PeakTroughShape,
    }


def _check_attributes(name: str, base: type, overrides: Mapping[str, Any], where: str) -> None:
    unknown = [key for key in overrides if not hasattr(base, key)]
    if unknown:
        known = sorted(k for k in dir(base) if not k.startswith("_") and k.islower())
        raise TrafficError(
            f"{where}: {name} has no attribute(s) {', '.join(unknown)}; "
            f"known attributes: {', '.join(known)}"
        )


def _attribute(key: str, value: Any, where: str) -> Any:
    """YAML cannot hold a function: `wait_time: 2` is constant(2), `[a, b]` is between(a, b)."""
    if key != "wait_time":
        return value
    if isinstance(value, int | float):
        return constant(value)
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int | float) for v in value)
    ):
        return between(value[0], value[1])
    raise TrafficError(f"{where}.wait_time: give seconds (2) or a range ([0.5, 2]), got {value!r}")


def build_user_classes(
    plan: Plan, host: str, available: Mapping[str, type[User]] | None = None
) -> list[type[User]]:
    """One subclass per plan class, with host, weight/fixed_count and attribute overrides."""
    available = workload_classes() if available is None else available
    built: list[type[User]] = []
    for name, spec in plan.traffic.classes.items():
        base_name = spec.base or name
        if base_name not in available:
            raise TrafficError(
                f"traffic.classes.{name}: the workloads package has no user class "
                f"{base_name!r}; it has {', '.join(sorted(available))}"
            )
        base = available[base_name]
        where = f"traffic.classes.{name}.attributes"
        _check_attributes(name, base, spec.attributes, where)
        attrs: dict[str, Any] = {k: _attribute(k, v, where) for k, v in spec.attributes.items()}
        attrs.update(host=host, weight=spec.weight, abstract=False)
        if plan.traffic.prompt_scale != 1.0:
            for size in PROMPT_SIZES:
                if hasattr(base, size):
                    value = attrs.get(size, getattr(base, size))
                    attrs[size] = max(1, round(value * plan.traffic.prompt_scale))
        if "seed" not in spec.attributes and hasattr(base, "seed"):
            attrs["seed"] = plan.seed
        if isinstance(plan.target, ReferenceTarget) and hasattr(base, "model"):
            attrs.setdefault("model", plan.target.model)
        if spec.fixed_count is not None:
            attrs["fixed_count"] = spec.fixed_count
        if isinstance(plan.target, ExternalTarget):
            if plan.target.api_key and "api_key" not in spec.attributes:
                attrs["api_key"] = plan.target.api_key
            if plan.target.model and "model" not in spec.attributes and hasattr(base, "model"):
                attrs["model"] = plan.target.model
            # only the request extensions the server's profile says it accepts
            profile = plan.target.profile
            if attrs.get("ignore_eos", getattr(base, "ignore_eos", False)) and not (
                profile.accepts("ignore_eos")
            ):
                attrs["ignore_eos"] = False
                log.warning(
                    "traffic.classes.%s: ignore_eos is not sent to this %s server (%s); "
                    "its outputs end where the model stops",
                    name,
                    profile.kind,
                    profile.source_file,
                )
        if spec.weight == 0 and not spec.fixed_count:
            continue  # Locust drops weight-0 classes anyway; say so by not building it
        built.append(type(name, (base,), attrs))
    if not built:
        raise TrafficError("traffic.classes: every class has weight 0; nothing would run")
    return built


def build_shape(
    plan: Plan, available: Mapping[str, type[LoadTestShape]] | None = None
) -> LoadTestShape | None:
    """The plan's load shape, or None for `constant` (the orchestrator holds the user count)."""
    if plan.load.shape == "constant":
        return None
    available = workload_shapes() if available is None else available
    base = available[plan.load.shape]
    _check_attributes(base.__name__, base, plan.load.shape_attributes, "load.shape_attributes")
    shape_cls = type(f"Plan{base.__name__}", (base,), dict(plan.load.shape_attributes))
    shape: LoadTestShape = shape_cls()
    return shape
