"""The plan: a YAML file, validated by pydantic, that says what one run does.

`load_plan(path, overrides)` reads the YAML, applies `--set key.path=value` overrides and
validates; every problem is raised as one `PlanError` whose lines name the YAML path, the
bad value and what is allowed, so a person can fix the file without reading this module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

import contract
from contract import servers
from contract.host import FOREIGN_MEAN_BOUND_SHARE, FOREIGN_WINDOW_BOUND_SHARE, LOOP_LAG_BOUND_MS
from harness.faults.base import FaultSpec
from harness.faults.registry import FAULT_MODELS, Fault
from harness.plan_trace import SCHEDULE_ERROR_BOUND_MS, TraceSpec

if TYPE_CHECKING:
    from workloads.users import KvgateUser

ShapeName = Literal["constant", "step_ramp", "soak", "peak_trough"]
SHAPES: tuple[ShapeName, ...] = get_args(ShapeName)


class PlanError(ValueError):
    """A plan that cannot run; the message lists each problem on its own line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReferenceTarget(_Strict):
    """The shipped reference deployment, started and stopped by the harness."""

    type: Literal["reference"] = "reference"
    replicas: int = Field(2, ge=1, le=8)
    policy: contract.PolicyName = contract.DEFAULT_POLICY
    gpu: contract.GpuName = contract.DEFAULT_GPU
    model: contract.ModelName = contract.DEFAULT_MODEL
    scheduler_config: str | None = None  # path to a scheduler YAML, relative to the plan
    scheduler: dict[str, Any] = Field(default_factory=dict)  # inline scheduler config keys
    tenants: str | None = None  # path to a tenants YAML, relative to the plan
    time_scale: float | None = Field(None, gt=0)
    kv_actual_factor: float | None = Field(None, gt=0)
    mutant: contract.MutantName | None = None  # a named bug, for `kvgate qualify`
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
    # The server's main process, when kvgate runs on its host: its CPU and RSS are sampled,
    # and its death outside any injected fault counts against `no_oom` (an OOM or a crash).
    # A pidfile is read at every sample, so a restart is followed.
    pid: int | None = Field(None, gt=1)
    pidfile: str | None = Field(None, min_length=1)
    # Request extensions not to send although the profile accepts them (`{cache_salt: false}`:
    # a gateway that forgets the salt); an extension the profile does not accept cannot be
    # switched on here.
    extensions: dict[str, bool] = Field(default_factory=dict)

    @field_validator("extensions")
    @classmethod
    def _known_extensions(cls, value: dict[str, bool]) -> dict[str, bool]:
        unknown = sorted(set(value) - set(servers.EXTENSIONS))
        if unknown:
            raise ValueError(
                f"unknown extensions {unknown}; known: {', '.join(servers.EXTENSIONS)}"
            )
        return value

    def sends(self, extension: str) -> bool:
        """Whether requests to this target carry `extension`: its profile accepts it and the
        plan did not switch it off."""
        return self.profile.accepts(extension) and self.extensions.get(extension, True)

    @model_validator(mode="after")
    def _extensions_accepted(self) -> ExternalTarget:
        refused = [k for k, on in self.extensions.items() if on and not self.profile.accepts(k)]
        if refused:
            raise ValueError(
                f"extensions {refused}: a {self.kind} server does not accept them "
                f"({self.profile.source_file})"
            )
        return self

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


class VllmTarget(ExternalTarget):
    """A vLLM server that kvgate starts, watches and stops itself (harness/engines/vllm.py):
    the engine flags that decide KV-cache behaviour are part of the plan, its log and its
    scheduler's per-request events go into the run directory, and its whole process tree
    is stopped at the end. On this kind of machine it is vLLM's CPU build with the tiny local
    model that `make vllm` sets up; on a GPU host, `python` and `model` name a CUDA vLLM and a
    real model (docs/real-engines.md)."""

    # a narrower tag than ExternalTarget's, as a discriminated union needs; mypy reads the
    # override as a change of the field's type
    type: Literal["vllm"] = "vllm"  # type: ignore[assignment]
    url: str = "http://127.0.0.1:0"  # the port is chosen when the server starts (0: free one)
    kind: str = "vllm"
    python: str | None = None  # the vLLM venv's interpreter; None: the cached CPU install
    model_path: str | None = None  # a model directory or hub id; None: the cached tiny model
    model: str | None = "tiny-llama"  # the served model name requests carry
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: str = "float32"
    max_model_len: int = Field(4096, ge=64)
    kv_blocks: int | None = Field(64, ge=2)  # --num-gpu-blocks-override; None: vLLM sizes it
    block_size: int | None = Field(128, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    scheduling_policy: Literal["priority", "fcfs"] = "priority"
    prefix_caching: bool = True
    prompt_tokens_details: bool = True  # usage.prompt_tokens_details.cached_tokens
    enforce_eager: bool = True  # skips torch.compile: start-up 35 s instead of 50-90 s on CPU
    # CPU build only: GiB of KV space to allocate (whole GiB), and the cores its worker binds
    # (VLLM_CPU_OMP_THREADS_BIND: "1" is core 1, leaving core 0 to the load generator, with
    # one CPU reserved; "all" leaves the variable unset, so vLLM binds as it likes).
    cpu_kvcache_space_gib: int = Field(1, ge=1)
    cpu_threads_bind: str = "1"
    record_events: bool = True  # kvgate's scheduler recorder (per-request events)
    extra_args: list[str] = Field(default_factory=list)  # passed to vLLM verbatim
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(300.0, gt=0, le=1800)
    health_timeout_s: float = Field(300.0, gt=0, le=1800)
    stop_timeout_s: float = Field(20.0, gt=0, le=300)

    @field_validator("kind")
    @classmethod
    def _is_vllm(cls, kind: str) -> str:
        if kind != "vllm":
            raise ValueError("a vllm target's kind is vllm")
        return kind


Target = Annotated[ReferenceTarget | VllmTarget | ExternalTarget, Field(discriminator="type")]
TARGET_MODELS: dict[str, type[_Strict]] = {
    "reference": ReferenceTarget,
    "vllm": VllmTarget,
    "external": ExternalTarget,
}


def traffic_classes() -> Mapping[str, type[KvgateUser]]:
    """The registered traffic classes (workloads/users/): what a plan's classes name.

    Imported on first use, not with this module. The classes are Locust users, and
    importing Locust patches the process for gevent: validating a plan's traffic does that,
    since the registry is the one list of classes, and `kvgate run` and `kvgate qualify`
    validate their plans before they open anything. A process that reads only a target's or
    a fault's model (a vLLM deployment) stays unpatched."""
    from workloads.users import USER_CLASSES

    return USER_CLASSES


class TrafficClass(_Strict):
    """One Locust user class of the mix: its weight (or fixed count) and attribute overrides.

    The plan key names a registered traffic class, or anything when `base` names the class
    (so one class can appear twice, e.g. long_context for two tenants). `attributes` are
    checked against that class's attribute model (workloads/users/registry.py)."""

    base: str | None = None
    weight: int = Field(1, ge=0)
    fixed_count: int | None = Field(None, ge=0)
    attributes: dict[str, Any] = Field(default_factory=dict)

    @field_validator("base")
    @classmethod
    def _registered(cls, base: str | None) -> str | None:
        known = traffic_classes()
        if base is not None and base not in known:
            raise ValueError(f"{base!r} is not a traffic class; one of {', '.join(known)}")
        return base


class Traffic(_Strict):
    classes: dict[str, TrafficClass] = Field(default_factory=dict)
    # a production trace replayed open loop beside the classes (harness/plan_trace.py)
    trace: TraceSpec | None = None
    stop_timeout_s: float = Field(20.0, ge=0, le=300)  # in-flight requests may finish this long
    # Every class's prompt sizes (prompt_tokens, prefix_tokens) times this: a server whose
    # tokenizer counts kvgate's prompts differently (the report gives the ratio it saw) gets
    # the sizes the plan means in its own tokens.
    prompt_scale: float = Field(1.0, gt=0, le=100)

    @model_validator(mode="after")
    def _known_classes(self) -> Traffic:
        """Each class names a registered traffic class, and its attributes fit that class's
        attribute model: each attribute's problem is an error at its own YAML path."""
        from workloads.users.registry import NAME_PATTERN, attribute_errors  # see traffic_classes

        known = traffic_classes()
        if not self.classes and self.trace is None:
            raise ValueError(
                "traffic has neither classes nor a trace: give traffic.classes (the traffic "
                "classes' users) or traffic.trace (a production trace to replay), or both"
            )
        errors: list[InitErrorDetails] = []
        for name, spec in self.classes.items():
            if spec.base is None and name not in known:
                raise ValueError(
                    f"traffic class {name!r} is not one of {', '.join(known)}; "
                    f"use one of those names, or give it `base: <one of them>`"
                )
            if not re.fullmatch(NAME_PATTERN, name):
                raise ValueError(f"traffic class name {name!r}: use letters, digits and _")
            where = ("classes", name, "attributes")
            errors += attribute_errors(known[spec.base or name], spec.attributes, where)
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self


class StopIfFailing(_Strict):
    """Stop the load early when the target fails at least `share` of the first requests
    (`min_requests` of them or more, within `within_s` of the start): nothing listening, a
    wrong model name, every key refused. The run is still judged, and fails on availability."""

    share: float = Field(0.9, gt=0, le=1)
    min_requests: int = Field(20, ge=1)
    within_s: float = Field(30.0, gt=0)


# Without faults, the least a load that runs until decided runs; with them, until this long
# after the last one fires (each fault fires, and its effect is seen), within the maximum.
UNTIL_MIN_DURATION_S = 30.0
UNTIL_AFTER_LAST_FAULT_S = 10.0


class Load(_Strict):
    """Shape and duration. `constant` holds `users`; the others use the workloads' shapes.

    `until: decided` runs the load until every key gate, and every other blocking gate with
    data, is decided by its anytime-valid bound (harness/live/until.py), at least
    `min_duration_s` and at most `max_duration_s`; `duration_s` is then only the maximum's
    default, and is set to the maximum, so every reader of the planned length (the deadline,
    the console, the evidence checks) reads it."""

    shape: ShapeName = "constant"
    users: int = Field(8, ge=1, le=2000)
    spawn_rate: float = Field(4.0, gt=0)
    duration_s: float = Field(60.0, gt=0, le=86400)
    until: Literal["duration", "decided"] = "duration"
    # until: decided only; the minimum's default depends on the faults (Plan._until_fits)
    min_duration_s: float | None = Field(None, gt=0, le=86400)
    max_duration_s: float | None = Field(None, gt=0, le=86400)
    shape_attributes: dict[str, Any] = Field(default_factory=dict)
    idle_before_s: float = Field(3.0, ge=0, le=600)  # sampled before load: memory baseline
    idle_after_s: float = Field(5.0, ge=0, le=600)  # sampled after load: does memory fall back
    stop_if_failing: StopIfFailing | None = StopIfFailing()  # null: never stop early

    @model_validator(mode="after")
    def _until_limits(self) -> Load:
        if self.until == "duration":
            given = [
                k for k in ("min_duration_s", "max_duration_s") if getattr(self, k) is not None
            ]
            if given:
                verb = "apply" if len(given) > 1 else "applies"
                raise ValueError(
                    f"{' and '.join(given)} {verb} only to a load that runs until its gates "
                    "are decided: set until: decided, or give the load's length as duration_s"
                )
            return self
        self.max_duration_s = self.duration_s = self.max_duration_s or self.duration_s
        if self.min_duration_s is not None and self.min_duration_s > self.max_duration_s:
            raise ValueError(
                f"min_duration_s ({self.min_duration_s:g} s) is longer than max_duration_s "
                f"({self.max_duration_s:g} s): the load would have to stop before it may; "
                "make min_duration_s at most max_duration_s"
            )
        return self


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
    # the host's CPU: kvgate's, the target's and every other process's (harness/samplers/host.py)
    host: Interval = Field(default_factory=lambda: Interval(interval_s=1.0))
    # the metric families every server profile names (contract/profiles/)
    metric_prefixes: list[str] = Field(
        default_factory=lambda: list(
            dict.fromkeys(p for prof in servers.profiles().values() for p in prof.metric_prefixes)
        )
    )
    # p99 over time of the simulator's step lag (harness/summary.py): in the worst 1% of a
    # run's seconds the simulator may be this late, and no further. A forty-fifth of the
    # critical-TTFT line (900 ms), so a verdict near its line does not move with the
    # simulator's own stalls; a replica at 500 streams on a quiet machine stays within a
    # quarter of it (`kvgate bench server`: p99 <= 5 ms).
    sim_lag_bound_ms: float = Field(20.0, gt=0)
    # The share of the host's CPUs other processes may use, on average over the load and in
    # any 10 s of it, before the run is INVALID (gates/evidence/checks_host.py says why these
    # numbers). 1 never invalidates: other processes cannot use more than every CPU.
    foreign_cpu_bound_share: float = Field(FOREIGN_MEAN_BOUND_SHARE, gt=0, le=1)
    foreign_cpu_window_bound_share: float = Field(FOREIGN_WINDOW_BOUND_SHARE, gt=0, le=1)
    # A replayed trace's requests may go out this late at p99 (t_send - t_scheduled) before
    # the run is INVALID (gates/evidence/checks_schedule.py says why this number).
    schedule_error_bound_ms: float = Field(SCHEDULE_ERROR_BOUND_MS, gt=0)
    # The load generator's event loop may wake this late at p99 over the load before the run
    # is INVALID (gates/evidence/checks_client.py says why this number).
    loop_lag_bound_ms: float = Field(LOOP_LAG_BOUND_MS, gt=0)


class Misconfiguration(_Strict):
    """A real way to get a server wrong, for `kvgate qualify`: the plan overrides that make
    it (`--set` assignments) and the gates meant to catch it, the most direct first. The
    reference server's bugs are built in (contract.MUTANTS); a real engine's are the
    misconfigurations its plan declares."""

    summary: str = Field(min_length=1)
    set: list[str] = Field(min_length=1)
    gates: list[str] = Field(min_length=1)


class Plan(_Strict):
    name: str = Field("run", pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = 0
    target: Target = Field(default_factory=ReferenceTarget)
    traffic: Traffic
    load: Load = Field(default_factory=Load)
    faults: list[Fault] = Field(default_factory=list)
    samplers: Samplers = Field(default_factory=Samplers)
    gates: str | None = None  # gate file, relative to the plan; None: the built-in gates
    # while the load runs, rewrite report.html (marked interim) this often; None: only at the end
    report_every_s: float | None = Field(None, ge=10)
    output_dir: str = "runs"
    base_dir: str = Field(".", exclude=True)  # the plan file's folder, for relative paths
    # what `kvgate qualify` runs besides the plan itself on a target other than the
    # reference server: each must fail its gates (and the run)
    misconfigurations: dict[str, Misconfiguration] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _trace_fits(self) -> Plan:
        """A replay's load lasts its span plus its drain unless the plan says otherwise; a
        load of fixed length must hold every send of the replay."""
        spec = self.traffic.trace
        if spec is None:
            return self
        from contract.trace import TraceError
        from harness.plan_trace import schedule

        try:
            replay = schedule(spec, self.base_dir)
        except TraceError as exc:
            text = str(exc)
            raise ValueError(
                text if text.startswith("traffic.") else f"traffic.trace: {text}"
            ) from None
        if not replay.requests:
            raise ValueError(
                f"traffic.trace: no request of {spec.path} is left to send ({replay.in_window} "
                f"in the window, {replay.skipped} skipped over max_input_tokens, "
                f"{replay.unmatched} matched no rule); widen the window or the rules"
            )
        load = self.load
        wanted = replay.span_s + spec.drain_s
        if "duration_s" not in load.model_fields_set and load.until == "duration":
            load.duration_s = max(wanted, 1.0)
        elif load.until == "duration" and replay.span_s >= load.duration_s:
            raise ValueError(
                f"traffic.trace: the replay sends for {replay.span_s:.0f} s, longer than "
                f"load.duration_s ({load.duration_s:g} s); leave duration_s out (the replay's "
                f"span plus drain_s: {wanted:.0f} s), or shorten the window"
            )
        return self

    @model_validator(mode="after")
    def _until_fits(self) -> Plan:
        """A load that runs until decided may stop at min_duration_s, so every fault must
        fire before it: a fault the load stopped before would leave the gates that judge it
        without the fault. By default the minimum is UNTIL_MIN_DURATION_S, or later, until
        UNTIL_AFTER_LAST_FAULT_S after the last fault, within the maximum."""
        load = self.load
        if load.until != "decided":
            return self
        assert load.max_duration_s is not None  # Load._until_limits sets it
        if load.min_duration_s is None:
            last = max((f.at_s + UNTIL_AFTER_LAST_FAULT_S for f in self.faults), default=0.0)
            load.min_duration_s = min(max(UNTIL_MIN_DURATION_S, last), load.max_duration_s)
        for i, fault in enumerate(self.faults):
            if fault.at_s >= load.min_duration_s:
                raise ValueError(
                    f"faults.{i} ({fault.kind} at {fault.at_s:g}s) is not before "
                    f"load.min_duration_s ({load.min_duration_s:g}s): a load that runs until "
                    "decided may stop there, before the fault fires; raise min_duration_s "
                    "past it (or leave it out: it then defaults to "
                    f"{UNTIL_AFTER_LAST_FAULT_S:g} s after the last fault), or move the fault"
                )
        return self

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
            if fault.uses_proxy and not plain_http:
                raise ValueError(
                    f"{where}: {fault.kind} faults need an http:// target (kvgate's proxy "
                    "forwards plain TCP, and TLS to it would name the wrong host)"
                )
            replica = fault.admin_replica()
            if replica is None:
                continue
            if isinstance(target, VllmTarget):
                ids = {"vllm"}
            elif isinstance(target, ReferenceTarget):
                ids = {f"r{n}" for n in range(target.replicas)}
            else:
                raise ValueError(
                    f"{where}: {fault.kind} faults need a target kvgate runs (reference or "
                    "vllm: it acts on their processes itself); against an external target "
                    f"use a {_any_target_kinds()} fault, or remove it with --set faults=[]"
                )
            if replica not in ids:
                raise ValueError(
                    f"fault at {fault.at_s}s names replica {replica!r}; "
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


def _any_target_kinds() -> str:
    """The fault kinds that work on any target (no admin API of a deployment kvgate runs),
    as "a, b or c"; a kind says so by leaving `admin_replica` alone."""
    names = sorted(
        name
        for name, model in FAULT_MODELS.items()
        if model.admin_replica is FaultSpec.admin_replica
    )
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)


def _format_errors(source: str, exc: ValidationError) -> str:
    lines = [f"{source}: {exc.error_count()} problem(s) in the plan:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-after"))
        where = re.sub(r"^target\.(reference|external|vllm)\b", "target", where)
        where = re.sub(rf"^faults\.(\d+)\.({'|'.join(FAULT_MODELS)})\b", r"faults.\1", where)
        where = where.replace(".[key]", " (key)")
        value = err.get("input")
        shown = repr(value) if not isinstance(value, dict) else "{...}"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(err["loc"][:-1])
            msg = f"unknown key; allowed keys: {', '.join(allowed)}" if allowed else msg
        elif err["type"].startswith("union_tag_") and err["loc"][:1] == ("faults",):
            msg = f"a fault's kind is one of {', '.join(sorted(FAULT_MODELS))}"
            value = value.get("kind") if isinstance(value, dict) else value
            shown = repr(value)
        lines.append(f"  {where or '(top level)'}: {msg} (got {shown})")
    return "\n".join(lines)


def _allowed_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the plan model found at `loc`, for 'unknown key' messages."""
    model: Any = Plan
    for part in loc:
        if part in TARGET_MODELS:
            model = TARGET_MODELS[str(part)]
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
