"""A plan's `traffic.trace`: the production trace it replays, how, and as whom.

The section is validated here (pydantic, errors at their YAML path), and `schedule()` reads
the trace once per process and turns it into the replay's schedule
(workloads/sources/trace.py), which the harness gives the replay's Locust user.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

import contract
from contract.trace import Trace, TraceError
from workloads.sources.trace import OverMax, Rule, Scaling, Schedule, build_schedule

# What request timing a replay holds to: the p99 of `t_send - t_scheduled` over its requests
# may be this late before the run is INVALID (gates/evidence/checks_schedule.py says why).
SCHEDULE_ERROR_BOUND_MS = 25.0
# What the open-loop sender itself should hold at 100 requests a second (`kvgate bench replay`).
SCHEDULE_ERROR_TARGET_MS = 5.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TraceRuleSpec(_Strict):
    """Requests that match every condition given go out as `traffic_class` from `tenant`
    at `priority`. The first rule that matches a request decides it."""

    traffic_class: contract.TrafficClassName = "short_qa"
    tenant: str = "acme"
    priority: contract.PriorityName = "interactive"
    # The key sent (never recorded); None: the key of a registered traffic class of that
    # tenant (workloads/users/), so the reference server's demo tenants need none.
    api_key: str | None = None
    api_key_name: str | None = None
    public_prefix: bool = False  # its prefixes may be shared across tenants
    min_input_tokens: int | None = Field(None, ge=1)
    max_input_tokens: int | None = Field(None, ge=1)
    # A share of the sessions: [from, to) of [0, 1), where a request's session is its first
    # `session_blocks` block ids, hashed (the same session always lands in the same place).
    sessions: tuple[float, float] | None = None

    @field_validator("sessions")
    @classmethod
    def _unit_range(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not 0 <= value[0] < value[1] <= 1:
            raise ValueError(f"sessions is [from, to) within [0, 1], from < to; got {list(value)}")
        return value


class TraceSpec(_Strict):
    """The trace replayed open loop: each request at its own time (`time_scale` times the
    trace's), beside the plan's traffic classes, whatever the answers before it."""

    path: str  # relative to the plan file
    format: str | None = None  # a registered trace format; None: from the file's name
    block_tokens: int | None = Field(None, ge=1)  # the trace's block size; None: the format's
    start_s: float = Field(0.0, ge=0)  # the window's start, in the trace's seconds
    duration_s: float | None = Field(None, gt=0)  # the window's length; None: to the end
    time_scale: float = Field(1.0, gt=0, le=100)  # replay seconds per trace second
    token_scale: float = Field(1.0, gt=0, le=10)  # input and output tokens, blocks alike
    max_input_tokens: int | None = Field(None, ge=1)  # after scaling
    over_max: Literal["clip", "skip"] = "clip"
    session_blocks: int = Field(1, ge=1)
    # After the last send, the answers may take this long before the load ends (the load's
    # length when the plan gives none: the replay's span plus drain_s).
    drain_s: float = Field(30.0, ge=0, le=3600)
    timeout_s: float = Field(300.0, gt=0)  # one request's limit
    rules: list[TraceRuleSpec] = Field(default_factory=lambda: [TraceRuleSpec()], min_length=1)

    @field_validator("format")
    @classmethod
    def _registered(cls, value: str | None) -> str | None:
        from workloads.sources import TRACE_FORMATS

        if value is not None and value not in TRACE_FORMATS:
            raise ValueError(f"unknown trace format {value!r}; one of {', '.join(TRACE_FORMATS)}")
        return value

    @model_validator(mode="after")
    def _keys_known(self) -> TraceSpec:
        from workloads.users import USER_CLASSES

        keys = {cls.tenant: (cls.api_key, cls.api_key_name) for cls in USER_CLASSES.values()}
        for i, rule in enumerate(self.rules):
            if rule.api_key is None and rule.tenant not in keys:
                raise ValueError(
                    f"rules.{i}: no traffic class sends as tenant {rule.tenant!r}, so its key "
                    f"is unknown; give the rule an api_key (known tenants: {', '.join(keys)})"
                )
            if rule.api_key is None:
                rule.api_key, rule.api_key_name = keys[rule.tenant]
        return self


def read(spec: TraceSpec, plan_dir: str) -> Trace:
    """The trace the spec names, read once per process (a worker reads its plan again)."""
    path = Path(spec.path).expanduser()
    path = path if path.is_absolute() else Path(plan_dir) / path
    if not path.is_file():
        raise TraceError(
            f"traffic.trace.path: {path} is not a file (paths are relative to the plan); "
            "point it at a Mooncake .jsonl or an Azure .csv trace"
        )
    return _read(str(path.resolve()), path.stat().st_mtime_ns, spec.format, spec.block_tokens)


@lru_cache(maxsize=4)
def _read(path: str, _mtime_ns: int, fmt: str | None, block_tokens: int | None) -> Trace:
    from contract.trace import detect_format
    from workloads.sources import TRACE_FORMATS

    reader = TRACE_FORMATS[fmt or detect_format(Path(path)).value]
    return reader(Path(path), block_tokens)


def schedule(spec: TraceSpec, plan_dir: str) -> Schedule:
    """The replay's schedule: the spec's window of its trace, scaled, limited and matched
    (built once per process for a spec: the plan's checks, the user class and meta.json
    read the same one)."""
    return _schedule(spec.model_dump_json(), plan_dir)


@lru_cache(maxsize=4)
def _schedule(spec_json: str, plan_dir: str) -> Schedule:
    spec = TraceSpec.model_validate_json(spec_json)
    trace = read(spec, plan_dir)
    scaling = Scaling(
        start_s=spec.start_s,
        duration_s=spec.duration_s,
        time_scale=spec.time_scale,
        token_scale=spec.token_scale,
        max_input_tokens=spec.max_input_tokens,
        over_max=OverMax(spec.over_max),
        session_blocks=spec.session_blocks,
    )
    return build_schedule(trace, scaling, rules(spec))


def rules(spec: TraceSpec) -> tuple[Rule, ...]:
    """The spec's rules as the workload reads them."""
    return tuple(
        Rule(
            traffic_class=r.traffic_class,
            tenant=r.tenant,
            priority=r.priority,
            api_key=r.api_key or "",
            api_key_name=r.api_key_name,
            public_prefix=r.public_prefix,
            min_input_tokens=r.min_input_tokens,
            max_input_tokens=r.max_input_tokens,
            sessions=r.sessions,
        )
        for r in spec.rules
    )
