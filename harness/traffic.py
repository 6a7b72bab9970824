"""The traffic mix of a plan as Locust classes: user classes with overrides, and the load shape.

Every plan class becomes a subclass of the registered traffic class it names (its plan key,
or its `base`), named after the plan key (Locust's master and workers match classes by
name, so both sides build the same names). Overrides are class attributes, validated and
converted by the class's attribute model (workloads/users/registry.py), the one the plan
was validated with. Every class also gets the target's request dialect: which extensions go
out, and how.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from locust import LoadTestShape, User

import contract
from contract import servers
from harness.plan import ExternalTarget, Plan, ReferenceTarget
from harness.plan_trace import schedule
from harness.replay import replay_user_class
from workloads.block_ids import BLOCK_TOKENS
from workloads.dialect import Dialect
from workloads.users import USER_CLASSES, registry

log = logging.getLogger(__name__)
PROMPT_SIZES = ("prompt_tokens", "prefix_tokens")  # what traffic.prompt_scale multiplies
# What a class may ask for that only an extension carries: (attribute, the extension, which
# is also the dialect's field, and what its requests do where the target does not take it).
ASKED_EXTENSIONS = (
    ("ignore_eos", "ignore_eos", "its outputs end where the model stops"),
    ("min_tokens", "min_tokens", "its outputs may end before min_tokens"),
)


class TrafficError(ValueError):
    """The plan's traffic cannot run: a priority no stage knows, a shape attribute the shape
    lacks, no class with users (the plan's validation checked class names and attributes)."""


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


def target_profile(plan: Plan) -> servers.ServerProfile:
    target = plan.target
    return target.profile if isinstance(target, ExternalTarget) else servers.profile("reference")


def target_dialect(plan: Plan) -> Dialect:
    """How requests to the plan's target carry kvgate's extensions: what its server profile
    accepts, less what the plan switched off (`target.extensions`)."""
    target = plan.target
    sends = target.sends if isinstance(target, ExternalTarget) else None
    return Dialect.for_profile(target_profile(plan), sends)


def build_user_classes(plan: Plan, host: str) -> list[type[User]]:
    """One subclass per plan class, with host, weight/fixed_count, attribute overrides and
    the target's dialect. The plan's validation checked each class's name and attributes
    against the registry; the same attribute model converts them here."""
    dialect, profile = target_dialect(plan), target_profile(plan)
    block_tokens = run_block_tokens(plan)
    built: list[type[User]] = []
    for name, spec in plan.traffic.classes.items():
        base = USER_CLASSES[spec.base or name]
        attrs = registry.configure(base, spec.attributes)
        attrs.update(host=host, weight=spec.weight, abstract=False, dialect=dialect)
        attrs.setdefault("block_tokens", block_tokens)
        if plan.traffic.prompt_scale != 1.0:
            for size in PROMPT_SIZES:
                if hasattr(base, size):
                    value = attrs.get(size, getattr(base, size))
                    attrs[size] = max(1, round(value * plan.traffic.prompt_scale))
        if "seed" not in spec.attributes:
            attrs["seed"] = plan.seed
        if isinstance(plan.target, ReferenceTarget):
            attrs.setdefault("model", plan.target.model)
        if spec.fixed_count is not None:
            attrs["fixed_count"] = spec.fixed_count
        if isinstance(plan.target, ExternalTarget):
            if plan.target.api_key and "api_key" not in spec.attributes:
                attrs["api_key"] = plan.target.api_key
            if plan.target.model and "model" not in spec.attributes:
                attrs["model"] = plan.target.model
        if spec.weight == 0 and not spec.fixed_count:
            continue  # Locust drops weight-0 classes anyway; say so by not building it
        cls = type(name, (base,), attrs)
        _check_priorities(cls, f"traffic.classes.{name}")
        _warn_unsent(cls, name, dialect, profile)
        built.append(cls)
    replay = replay_user_class(plan, _replay_attributes(plan, host, dialect, block_tokens))
    if replay is not None:
        built.append(replay)
    if not built:
        raise TrafficError("traffic.classes: every class has weight 0; nothing would run")
    return built


def run_block_tokens(plan: Plan) -> int:
    """The run's one block size for the records' `prompt_blocks`: a replayed trace's own
    (scaled) blocks, else BLOCK_TOKENS."""
    spec = plan.traffic.trace
    if spec is None:
        return BLOCK_TOKENS
    return schedule(spec, plan.base_dir).block_tokens or BLOCK_TOKENS


def _replay_attributes(
    plan: Plan, host: str, dialect: Dialect, block_tokens: int
) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "host": host,
        "dialect": dialect,
        "seed": plan.seed,
        "block_tokens": block_tokens,
    }
    if isinstance(plan.target, ReferenceTarget) or plan.target.model:
        attrs["model"] = plan.target.model
    return attrs


def _check_priorities(cls: type, where: str) -> None:
    """A class asks only for priorities every stage knows (the dialect maps each of them)."""
    asked = [getattr(cls, "priority", None)]
    asked += [entry[3] for entry in getattr(cls, "escalations", ())]
    unknown = sorted({str(p) for p in asked if p is not None and p not in contract.PRIORITIES})
    if unknown:
        raise TrafficError(
            f"{where}: priority {', '.join(unknown)} is not one of {', '.join(contract.PRIORITIES)}"
        )


def _warn_unsent(cls: type, name: str, dialect: Dialect, profile: servers.ServerProfile) -> None:
    """Says which of what a class asks for its target will not be sent, and why."""
    for attribute, extension, effect in ASKED_EXTENSIONS:
        if getattr(cls, attribute, None) in (None, False) or getattr(dialect, extension):
            continue
        why = "target.extensions" if profile.accepts(extension) else profile.source_file
        log.warning(
            "traffic.classes.%s: %s is not sent to this %s server (%s); %s",
            name,
            attribute,
            profile.kind,
            why,
            effect,
        )
    if getattr(cls, "escalations", ()) and not dialect.carries_priority:
        log.warning(
            "traffic.classes.%s: this %s server takes no priority (%s); its escalation "
            "probes ask for none",
            name,
            profile.kind,
            profile.source_file,
        )


def build_shape(
    plan: Plan, available: Mapping[str, type[LoadTestShape]] | None = None
) -> LoadTestShape | None:
    """The plan's load shape, or None for `constant` (the orchestrator holds the user count)."""
    if plan.load.shape == "constant":
        return None
    available = workload_shapes() if available is None else available
    base = available[plan.load.shape]
    _check_attributes(base.__name__, base, plan.load.shape_attributes, "load.shape_attributes")
    attributes = dict(plan.load.shape_attributes)
    if plan.load.until == "decided":
        attributes |= _until_lengths(plan.load.shape, base, attributes, plan.load.max_duration_s)
    shape_cls = type(f"Plan{base.__name__}", (base,), attributes)
    shape: LoadTestShape = shape_cls()
    return shape


def _until_lengths(
    name: str, base: type, attributes: Mapping[str, Any], max_s: float | None
) -> dict[str, Any]:
    """A shape's own length, for a load that runs until decided: as long as max_duration_s
    allows, in whole cycles for peaks and troughs; the stop rule ends it earlier, at a
    boundary (workloads/shapes.py). The plan's `cycles`, a soak's `duration_s` and a ramp's
    `max_duration_s` are replaced."""
    assert max_s is not None  # the plan's validation sets it with until: decided

    def value(key: str) -> float:
        return float(attributes.get(key, getattr(base, key)))

    if name == "peak_trough":
        period = value("peak_s") + value("trough_s")
        if period > max_s:
            raise TrafficError(
                f"load.max_duration_s ({max_s:g} s) holds no whole peak/trough cycle "
                f"({period:g} s: peak_s + trough_s); a load that runs until decided stops only "
                "at the end of a cycle, so raise max_duration_s or shorten the phases"
            )
        return {"cycles": int(max_s // period)}
    if name == "soak":
        hold = max_s - value("cooldown_s")
        if hold <= 0:
            raise TrafficError(
                f"load.max_duration_s ({max_s:g} s) leaves the soak no time before its "
                f"cooldown ({value('cooldown_s'):g} s); raise max_duration_s"
            )
        return {"duration_s": hold}
    if name == "step_ramp":
        return {"max_duration_s": min(value("max_duration_s"), max_s)}
    return {}
