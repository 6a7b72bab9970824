"""The fields of a run's meta.json that gates and reports rely on, and their types.

The harness writes more than this model names (extra fields are kept as they are); a field
it names must have its type, or gates.rundir refuses the run naming the field's JSON path.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Strict, ValidationError
from pydantic_core import ErrorDetails

# Strict: "12" is not a number and 0 is not false; an int is still a number.
Number = Annotated[float, Strict()]
Flag = Annotated[bool, Strict()]
Text = Annotated[str, Strict()]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Phase(_Open):
    """A named stretch of the load shape (peak, trough, ...), epoch seconds."""

    name: Text
    t0: Number
    t1: Number


class TargetMeta(_Open):
    """What the harness recorded about the server under test."""

    config: dict[str, Any] | None = None  # the scheduler config's values, when known


class RunMeta(_Open):
    """The meta.json fields gates and reports read; every one may be absent."""

    plan: dict[str, Any] | None = None
    target: TargetMeta | None = None
    # The server profile the run used, as the harness resolved it when the run started
    # (gates/run_profile.py reads it back; contract.servers.ServerProfile is its shape).
    target_profile: dict[str, Any] | None = None
    harness_version: Text | None = None
    t_start: Number | None = None
    t_end: Number | None = None
    cpu_warning: Flag = False
    cpu_warnings: list[dict[str, Any]] | None = None
    sim_lag_ms_p99: Number | None = None
    sim_lag_bound_ms: Number | None = None
    windows: dict[str, tuple[Number, Number] | None] | None = None
    phases: list[Phase] | None = None
    capacity: dict[str, Any] | None = None  # knees (user counts), stop_reason, steps


def meta_problems(meta: dict[str, Any]) -> list[str]:
    """Each field of `meta` whose type is wrong, named by its JSON path; empty when sound."""
    try:
        RunMeta.model_validate(meta)
    except ValidationError as exc:
        return [_problem(error) for error in exc.errors()]
    return []


def _problem(error: ErrorDetails) -> str:
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
    # pydantic appends the member type to the path of a union ("windows.stress.tuple[...]").
    where = where.split(".tuple[")[0].split(".function-")[0]
    # "a valid dictionary or instance of TargetMeta" means nothing to whoever reads meta.json.
    message = "should be a JSON object" if error["type"] in _OBJECT_TYPES else error["msg"]
    return f"{where.lstrip('.')}: {message} (found {error['input']!r})"


_OBJECT_TYPES = ("model_type", "dict_type")
