"""The plan: a YAML file, validated by pydantic, that says what one run does.

`load_plan(path, overrides)` reads the YAML, applies `--set key.path=value` overrides and
validates; every problem is raised as one `PlanError` whose lines name the YAML path, the
bad value and what is allowed, so a person can fix the file without reading this module.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

import contract
from contract import servers

SHAPES = ("constant", "step_ramp", "soak", "peak_trough")


class PlanError(ValueError):
    """A plan that cannot run; the message lists each problem on its own line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReferenceTarget(_Strict):
    """The shipped reference deployment, started and stopped by the harness."""

    type: Literal["reference"] = "reference"
    replicas: int = Field(2, ge=1, le=8)
    policy: Literal[contract.POLICIES] = contract.DEFAULT_POLICY
    gpu: Literal[contract.GPUS] = contract.DEFAULT_GPU
    model: Literal[contract.MODELS] = contract.DEFAULT_MODEL
    scheduler_config: str | None = None  # path to a scheduler YAML, relative to the plan
    scheduler: dict[str, Any] = Field(default_factory=dict)  # inline scheduler config keys
    tenants: str | None = None  # path to a tenants YAML, relative to the plan
    time_scale: float | None = Field(None, gt=0)
    kv_actual_factor: float | None = Field(None, gt=0)
    mutant: Literal[tuple(contract.MUTANTS)] | None = None  # a named bug, for `kvgate qualify`
    extra_args: list[str] = Field(default_factory=list)  # passed to `server.serve` verbatim
    startup_timeout_s: float = Field(60.0, gt=0, le=600)
    admin_key: str = "kvg-admin-key"

    @model_validator(mode="after")
    def _one_config_source(self) -> ReferenceTarget:
        if self.scheduler_config and self.scheduler:
            raise ValueError(
                "give either scheduler_config (a file) or scheduler (inline), not both"
            )
        return self


class ExternalTarget(_Strict):
    """A server someone else runs: health-checked, never started or stopped."""

    type: Literal["external"] = "external"
    url: str
    kind: str = "openai"  # a server profile (contract/profiles/): what to send and scrape
    api_key: str | None = None
    model: str | None = None  # None: the one model its /v1/models lists
    health_path: str | None = None  # None: the profile's
    health_timeout_s: float = Field(30.0, gt=0, le=600)

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        known = [k for k in servers.kinds() if k != "reference"]
        if kind not in known:
            raise ValueError(
                f"unknown server kind {kind!r}; one of {', '.join(known)} "
                "(a profile in contract/profiles/)"
            )
        return kind

    @property
    def profile(self) -> servers.ServerProfile:
        return servers.profile(self.kind)

    @model_validator(mode="after")
    def _url_scheme(self) -> ExternalTarget:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        self.url = self.url.rstrip("/")
        return self


Target = Annotated[ReferenceTarget | ExternalTarget, Field(discriminator="type")]


class TrafficClass(_Strict):
    """One Locust user class of the mix: its weight (or fixed count) and attribute overrides.

    The plan key names a workloads class, or anything when `base` names the class (so one
    class can appear twice, e.g. long_context for two tenants)."""

    base: Literal[contract.USER_CLASSES] | None = None
    weight: int = Field(1, ge=0)
    fixed_count: int | None = Field(None, ge=0)
    attributes: dict[str, Any] = Field(default_factory=dict)


class Traffic(_Strict):
    classes: dict[str, TrafficClass] = Field(min_length=1)
    stop_timeout_s: float = Field(20.0, ge=0, le=300)  # in-flight requests may finish this long
    # Every class's prompt sizes (prompt_tokens, prefix_tokens) times this: a server whose
    # tokenizer counts kvgate's prompts differently (the report gives the ratio it saw) gets
    # the sizes the plan means in its own tokens.
    prompt_scale: float = Field(1.0, gt=0, le=100)

    @model_validator(mode="after")
    def _known_classes(self) -> Traffic:
        for name, spec in self.classes.items():
            if spec.base is None and name not in contract.USER_CLASSES:
                raise ValueError(
                    f"traffic class {name!r} is not one of {', '.join(contract.USER_CLASSES)}; "
                    f"use one of those names, or give it `base: <one of them>`"
                )
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"traffic class name {name!r}: use letters, digits and _")
        return self


class StopIfFailing(_Strict):
    """Stop the load early when the target fails at least `share` of the first requests
    (`min_requests` of them or more, within `within_s` of the start): nothing listening, a
    wrong model name, every key refused. The run is still judged, and fails on availability."""

    share: float = Field(0.9, gt=0, le=1)
    min_requests: int = Field(20, ge=1)
    within_s: float = Field(30.0, gt=0)


class Load(_Strict):
    """Shape and duration. `constant` holds `users`; the others use the workloads' shapes."""

    shape: Literal[SHAPES] = "constant"
    users: int = Field(8, ge=1, le=2000)
    spawn_rate: float = Field(4.0, gt=0)
    duration_s: float = Field(60.0, gt=0, le=86400)
    shape_attributes: dict[str, Any] = Field(default_factory=dict)
    idle_before_s: float = Field(3.0, ge=0, le=600)  # sampled before load: memory baseline
    idle_after_s: float = Field(5.0, ge=0, le=600)  # sampled after load: does memory fall back
    stop_if_failing: StopIfFailing | None = StopIfFailing()  # null: never stop early


class _FaultBase(_Strict):
    """What every fault has: when it fires, in seconds after the load starts."""

    at_s: float = Field(ge=0)


class KillFault(_FaultBase):
    """SIGKILL a reference replica; restart it through the gateway after a delay."""

    kind: Literal["kill"] = "kill"
    replica: str = "r0"
    restart_after_s: float = Field(5.0, ge=0, le=600)


class PauseFault(_FaultBase):
    """SIGSTOP a reference replica; SIGCONT after `duration_s`."""

    kind: Literal["pause"] = "pause"
    replica: str = "r0"
    duration_s: float = Field(2.0, gt=0, le=600)


class KillDuringStormFault(_FaultBase):
    """Wait for a cancellation storm (`min_cancels` in 2 s), then kill like `kill`."""

    kind: Literal["kill_during_storm"] = "kill_during_storm"
    replica: str = "r0"
    restart_after_s: float = Field(5.0, ge=0, le=600)
    storm_wait_s: float = Field(20.0, gt=0, le=600)  # how long to wait for the storm
    min_cancels: int = Field(3, ge=1)  # cancellations within 2 s


# A signal fault's restart fields: none of them means anything without a restart_command.
# They default to None and are filled in by the validator, so a dumped plan validates again.
_RESTART_KEYS = (
    "restart_command",
    "restart_after_s",
    "timeout_s",
    "wait_healthy_url",
    "healthy_timeout_s",
)


class SignalFault(_FaultBase):
    """Send a signal to one process of any deployment: by pid, pidfile or command line.

    The rollback of STOP is CONT after `duration_s`; of any other signal, the user's
    `restart_command` after `restart_after_s` (none given: no rollback)."""

    kind: Literal["signal"] = "signal"
    signal: Literal[contract.FAULT_SIGNALS]
    pid: int | None = Field(None, gt=1)
    pidfile: str | None = Field(None, min_length=1)  # read when the fault fires
    match: str | None = Field(None, min_length=1)  # a substring of exactly one command line
    target: str | None = None  # the row's target, e.g. r0; default pid:N, pidfile:P, match:M
    duration_s: float | None = Field(None, gt=0, le=3600)  # STOP only; default 2
    restart_command: str | None = Field(None, min_length=1)  # a shell command
    restart_after_s: float | None = Field(None, ge=0, le=3600)  # default 5
    timeout_s: float | None = Field(None, gt=0, le=3600)  # restart_command's; default 60
    wait_healthy_url: str | None = None  # after the restart, poll until it answers 2xx
    healthy_timeout_s: float | None = Field(None, gt=0, le=3600)  # default 120

    @field_validator("signal", mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        """`SIGTERM`, `term` and `TERM` are one signal."""
        return value.upper().removeprefix("SIG") if isinstance(value, str) else value

    @model_validator(mode="after")
    def _coherent(self) -> SignalFault:
        given = [k for k in ("pid", "pidfile", "match") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of pid, pidfile or match (the process to signal); "
                f"got {', '.join(given) or 'none'}"
            )
        restart = [k for k in _RESTART_KEYS if getattr(self, k) is not None]
        if self.signal == "STOP":
            if restart:
                raise ValueError(
                    f"{', '.join(restart)}: a STOP is rolled back by CONT after duration_s; "
                    "restarts are for the other signals"
                )
            self.duration_s = 2.0 if self.duration_s is None else self.duration_s
            return self
        if self.duration_s is not None:
            raise ValueError(
                f"duration_s applies to STOP only (CONT follows it); after {self.signal}, "
                "give restart_command and restart_after_s"
            )
        if self.restart_command is None and restart:
            raise ValueError(f"{', '.join(restart)}: need a restart_command")
        url = self.wait_healthy_url
        if url is None and self.healthy_timeout_s is not None:
            raise ValueError("healthy_timeout_s needs a wait_healthy_url")
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"wait_healthy_url must start with http:// or https://, got {url!r}")
        if self.restart_command is not None:
            self.restart_after_s = 5.0 if self.restart_after_s is None else self.restart_after_s
            self.timeout_s = 60.0 if self.timeout_s is None else self.timeout_s
        if url is not None and self.healthy_timeout_s is None:
            self.healthy_timeout_s = 120.0
        return self


class CommandFault(_FaultBase):
    """Run the user's shell command (docker kill, kubectl delete pod, systemctl restart ...),
    and its `rollback` command `rollback_after_s` later; a non-zero exit fails the fault."""

    kind: Literal["command"] = "command"
    command: str = Field(min_length=1)
    rollback: str | None = Field(None, min_length=1)
    rollback_after_s: float | None = Field(None, ge=0, le=3600)  # with a rollback; default 0
    timeout_s: float = Field(30.0, gt=0, le=3600)  # for each command; then it is killed
    target: str = Field("command", min_length=1)  # the faults row's target (e.g. a replica id)

    @model_validator(mode="after")
    def _rollback_given(self) -> CommandFault:
        if self.rollback is None and self.rollback_after_s is not None:
            raise ValueError("rollback_after_s needs a rollback command")
        if self.rollback is not None and self.rollback_after_s is None:
            self.rollback_after_s = 0.0
        return self


class Toxic(_Strict):
    """A toxic of kvgate's proxy (toxiproxy's types, attributes and streams)."""

    type: Literal[contract.TOXIC_TYPES]
    attributes: dict[str, float] = Field(default_factory=dict)
    stream: Literal["downstream", "upstream"] = "downstream"
    toxicity: float = Field(1.0, ge=0, le=1)  # the share of connections it applies to

    @model_validator(mode="after")
    def _attributes_fit(self) -> Toxic:
        allowed = contract.TOXIC_ATTRIBUTES[self.type]
        unknown = sorted(set(self.attributes) - set(allowed))
        if unknown:
            raise ValueError(
                f"{self.type}: unknown attribute(s) {', '.join(unknown)}; "
                f"allowed: {', '.join(allowed)}"
            )
        negative = sorted(k for k, v in self.attributes.items() if v < 0)
        if negative:
            raise ValueError(f"{self.type}: attribute(s) {', '.join(negative)} must be >= 0")
        needed = {"latency": "latency", "bandwidth": "rate"}.get(self.type)
        if needed and not self.attributes.get(needed):
            raise ValueError(f"{self.type}: give attributes.{needed} (> 0)")
        return self


class NetworkFault(_FaultBase):
    """A toxic on kvgate's proxy between the load generator and the target, for
    `duration_s`; the rollback removes it."""

    kind: Literal["network"] = "network"
    duration_s: float = Field(gt=0, le=86400)
    toxic: Toxic


FAULT_MODELS = {
    model.model_fields["kind"].default: model
    for model in (
        KillFault,
        PauseFault,
        KillDuringStormFault,
        SignalFault,
        CommandFault,
        NetworkFault,
    )
}
FaultSpec = (
    KillFault | PauseFault | KillDuringStormFault | SignalFault | CommandFault | NetworkFault
)
Fault = Annotated[FaultSpec, Field(discriminator="kind")]


class Interval(_Strict):
    enabled: bool = True
    interval_s: float = Field(1.0, gt=0, le=60)


class ReleaseProbe(_Strict):
    """Cancel-to-release measured from a server's KV-usage gauge, after the load, on external
    targets whose profile names one (harness/release_probe.py)."""

    count: int = Field(5, ge=0, le=100)  # 0: no probe
    hz: float = Field(20.0, ge=1, le=100)  # gauge readings per second: the resolution
    prompt_tokens: int = Field(2048, ge=16)  # big enough for the gauge to show it
    wait_s: float = Field(10.0, gt=0, le=120)


class Samplers(_Strict):
    release_probe: ReleaseProbe = Field(default_factory=ReleaseProbe)
    nvml: Interval = Field(default_factory=lambda: Interval(interval_s=0.25))
    prometheus: Interval = Field(default_factory=lambda: Interval(interval_s=1.0))
    events: Interval = Field(default_factory=lambda: Interval(interval_s=0.5))
    process: Interval = Field(default_factory=lambda: Interval(interval_s=1.0))
    # the metric families every server profile names (contract/profiles/)
    metric_prefixes: list[str] = Field(
        default_factory=lambda: list(
            dict.fromkeys(p for prof in servers.profiles().values() for p in prof.metric_prefixes)
        )
    )
    # p99 over time of the simulator's step lag (harness/summary.py). A third of the
    # critical-TTFT gate's ~340 ms margin: in the worst 1% of a run's seconds the simulator
    # may be this late, and no further, without moving a latency verdict by itself.
    sim_lag_bound_ms: float = Field(100.0, gt=0)


class Plan(_Strict):
    name: str = Field("run", pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = 0
    target: Target = Field(default_factory=ReferenceTarget)
    traffic: Traffic
    load: Load = Field(default_factory=Load)
    faults: list[Fault] = Field(default_factory=list)
    samplers: Samplers = Field(default_factory=Samplers)
    gates: str | None = None  # gate file, relative to the plan; None: the built-in gates
    output_dir: str = "runs"
    base_dir: str = Field(".", exclude=True)  # the plan file's folder, for relative paths

    @model_validator(mode="after")
    def _faults_fit(self) -> Plan:
        target = self.target
        plain_http = isinstance(target, ReferenceTarget) or target.url.startswith("http://")
        for i, fault in enumerate(self.faults):
            where = f"faults.{i} ({fault.kind} at {fault.at_s}s)"
            if fault.at_s >= self.load.duration_s:
                raise ValueError(
                    f"{where} is not before the end of the load ({self.load.duration_s}s)"
                )
            if isinstance(fault, NetworkFault) and not plain_http:
                raise ValueError(
                    f"{where}: network faults need an http:// target (kvgate's proxy forwards "
                    "plain TCP, and TLS to it would name the wrong host)"
                )
            if not isinstance(fault, KillFault | PauseFault | KillDuringStormFault):
                continue
            if not isinstance(target, ReferenceTarget):
                raise ValueError(
                    f"{where}: kill, pause and kill_during_storm faults need a reference target "
                    "(they act through its gateway's admin API); against an external target "
                    "use a signal, command or network fault, or remove it with --set faults=[]"
                )
            ids = {f"r{n}" for n in range(target.replicas)}
            if fault.replica not in ids:
                raise ValueError(
                    f"fault at {fault.at_s}s names replica {fault.replica!r}; "
                    f"this target has {sorted(ids)}"
                )
        return self

    def resolve(self, path: str | None) -> Path | None:
        """A path from the plan, relative to the plan file's folder."""
        if path is None:
            return None
        p = Path(path).expanduser()
        return p if p.is_absolute() else Path(self.base_dir) / p

    def planned_seconds(self) -> float:
        return self.load.idle_before_s + self.load.duration_s + self.load.idle_after_s

    def check_files(self) -> None:
        """Raise PlanError unless every file the plan names exists (checked before starting
        anything, so a typo is not found by a server that fails to start)."""
        named = {"gates": self.gates}
        if isinstance(self.target, ReferenceTarget):
            named |= {
                "target.scheduler_config": self.target.scheduler_config,
                "target.tenants": self.target.tenants,
            }
        for key, value in named.items():
            path = self.resolve(value)
            if path is not None and not path.is_file():
                raise PlanError(f"{key}: {path} is not a file (paths are relative to the plan)")


def _format_errors(source: str, exc: ValidationError) -> str:
    lines = [f"{source}: {exc.error_count()} problem(s) in the plan:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-after"))
        where = re.sub(r"^target\.(reference|external)\b", "target", where)
        where = re.sub(rf"^faults\.(\d+)\.({'|'.join(FAULT_MODELS)})\b", r"faults.\1", where)
        where = where.replace(".[key]", " (key)")
        value = err.get("input")
        shown = repr(value) if not isinstance(value, dict) else "{...}"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(err["loc"][:-1])
            msg = f"unknown key; allowed keys: {', '.join(allowed)}" if allowed else msg
        elif err["type"].startswith("union_tag_") and err["loc"][:1] == ("faults",):
            msg = f"a fault's kind is one of {', '.join(FAULT_MODELS)}"
            value = value.get("kind") if isinstance(value, dict) else value
            shown = repr(value)
        lines.append(f"  {where or '(top level)'}: {msg} (got {shown})")
    return "\n".join(lines)


def _allowed_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the plan model found at `loc`, for 'unknown key' messages."""
    model: Any = Plan
    for part in loc:
        if part in ("reference", "external"):
            model = ReferenceTarget if part == "reference" else ExternalTarget
            continue
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            nested = {"classes": TrafficClass, **FAULT_MODELS}
            model = nested.get(str(part), model)
            continue
        annotation = fields[part].annotation
        model = next(
            (
                a
                for a in getattr(annotation, "__args__", (annotation,))
                if hasattr(a, "model_fields")
            ),
            annotation,
        )
    fields = getattr(model, "model_fields", {})
    return [name for name in fields if name != "base_dir"]


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Set `a.b.c=value` in nested plan data; the value is parsed as YAML (`3`, `[]`, `x`)."""
    if "=" not in assignment:
        raise PlanError(f"--set {assignment!r}: write KEY=VALUE, e.g. --set target.policy=naive")
    key, raw = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise PlanError(f"--set {assignment!r}: the key is empty")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise PlanError(f"--set {assignment!r}: the value is not valid YAML ({exc})") from None
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            node = _list_item(node, part, parts[: i + 1])
            continue
        if not isinstance(node, dict):
            raise PlanError(f"--set {assignment!r}: {'.'.join(parts[:i])} is not a mapping")
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        node = child
    last = parts[-1]
    if isinstance(node, list):
        node[_list_index(node, last, parts)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise PlanError(f"--set {assignment!r}: {'.'.join(parts[:-1])} is not a mapping")


def _list_index(node: list[Any], part: str, path: list[str]) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise PlanError(f"--set: {'.'.join(path)}: index must be 0..{len(node) - 1}")
    return int(part)


def _list_item(node: list[Any], part: str, path: list[str]) -> Any:
    return node[_list_index(node, part, path)]


def load_plan(
    path: str | Path, overrides: list[str] | None = None, target_url: str | None = None
) -> Plan:
    """Read, override and validate a plan file; raises PlanError naming every problem.

    `target_url` (`--target-url`) points the plan at an external server before the overrides
    apply, so `--set target.model=...` and the other external keys set that target's fields.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path}: no such plan file") from None
    except OSError as exc:
        raise PlanError(
            f"{path}: cannot be read ({exc.strerror or exc}); pass a plan file"
        ) from None
    except UnicodeDecodeError as exc:
        raise PlanError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except yaml.YAMLError as exc:
        raise PlanError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{path}: a plan is a YAML mapping (name, target, traffic, load, ...)")
    if target_url is not None:
        target = data.get("target")
        keep = dict(target) if isinstance(target, dict) and target.get("type") == "external" else {}
        data["target"] = {"type": "external", "kind": "openai", **keep, "url": target_url}
    for assignment in overrides or []:
        apply_override(data, assignment)
    data["base_dir"] = str(path.resolve().parent)
    return plan_from_dict(data, source=str(path))


def plan_from_dict(data: dict[str, Any], source: str = "plan") -> Plan:
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise PlanError(_format_errors(source, exc)) from None
