"""meta.json, the record of one run beside its tables: every field the harness writes, with
its type, as one model that the writer builds and every reader validates against.

The harness builds a RunMeta and writes its dump (`dumped`), so a misnamed field or a value
of the wrong type fails where the run writes it, not when someone judges the run a week
later. A reader validates what it finds with `RunMeta.read`: every field may be absent (a
run directory built by hand, or written by an older kvgate), a field that is there must have
its type, and fields the model does not name are kept as they are. A writer may not add an
unnamed field: a field the harness writes is named here first, so this file is the one
description of meta.json.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Strict, ValidationInfo, model_validator

# Strict: "12" is not a number and 0 is not false; an int is still a number.
Number = Annotated[float, Strict()]
Count = Annotated[int, Strict()]
Flag = Annotated[bool, Strict()]
Text = Annotated[str, Strict()]

# How a run stands: `running` from its first write until teardown, then how it ended.
RunStatus = Literal["running", "completed", "interrupted", "error"]
# The validation context a reader passes: fields the model does not name are then kept.
_READING: Final = "reading"


class _Record(BaseModel):
    """A part of meta.json. Readers keep the fields it does not name; a writer may not add
    one (the model is the description of what is written)."""

    model_config = ConfigDict(extra="allow")
    # Fields a writer may add without naming each: a part whose keys come from elsewhere
    # (the load shape's knees) types them with `__pydantic_extra__` and sets this.
    open_to_writers: ClassVar[bool] = False

    @model_validator(mode="after")
    def _every_written_field_is_named(self, info: ValidationInfo) -> _Record:
        reading = bool(info.context and info.context.get(_READING))
        unnamed = sorted(self.model_extra or {})
        if unnamed and not reading and not self.open_to_writers:
            raise ValueError(
                f"{type(self).__name__} has no field {', '.join(map(repr, unnamed))}: a field "
                "the harness writes into meta.json is named in contract/runmeta.py first, "
                "with its type (or the name is misspelt)"
            )
        return self


class Phase(_Record):
    """A named stretch of the load shape (peak, trough, step_3, ...), epoch seconds. `open`:
    the phase was still running when meta.json was written mid-run (its t1 is that moment),
    so a look judges it as part of a phase, not a whole one."""

    name: Text
    t0: Number
    t1: Number
    open: bool = False


class TargetMeta(_Record):
    """What the harness recorded about the server under test (harness/target.py)."""

    url: Text | None = None
    kind: Text | None = None  # the server profile's kind (contract/profiles/)
    model: Text | None = None
    model_digest: Text | None = None
    runtime_version: Text | None = None
    gpu_sku: Text | None = None
    scheduler_config_digest: Text | None = None
    policy: Text | None = None
    mutant: Text | None = None
    replicas: list[dict[str, Any]] | None = None  # {"id", "url", ...} per replica
    # The scheduler's config values (the reference server's), or the engine flags kvgate
    # started a vLLM with; {} for a server someone else runs.
    config: dict[str, Any] | None = None
    server_info: dict[str, Any] | None = None  # each info endpoint's JSON, by its path
    proxy: dict[str, Any] | None = None  # the network fault proxy: listen, upstream, counters


class Host(_Record):
    """A machine of the run: this one (its platform and CPUs), or a load generator worker's."""

    hostname: Text | None = None
    platform: Text | None = None
    cpus: Count | None = None
    role: Text | None = None  # "worker" for a remote load generator


class Gpu(_Record):
    """A device NVML showed (none without NVML)."""

    index: Count | None = None
    name: Text | None = None
    memory_total_mib: Number | None = None


class CpuWarning(_Record):
    """Locust's warning that a load generator process was over its CPU budget."""

    t: Number | None = None
    worker: Text | None = None
    cpu_percent: Number | None = None


class Capacity(_Record):
    """A step ramp's outcome: its knees, why it stopped, and its steps; no knees for other
    shapes. The knees are the shape's (workloads/shapes.py, StepRampShape.KNEES), each the
    user count at which the ramp crossed a line, or None."""

    open_to_writers = True
    __pydantic_extra__: dict[str, Count | None]
    stop_reason: Text | None = None
    # {"index", "users", "t0", "t1", "requests", "rejected", "rejected_capacity",
    # "rejected_policy", "rejected_other", "timeouts", "ttft_p95_s"} per step, as the shape
    # counts them
    steps: list[dict[str, Any]] | None = None


class Aborted(_Record):
    """The gate that stopped the load before its end (harness/live/watch.py)."""

    gate: Text
    at_s: Number  # seconds into the load
    message: Text


class UntilGate(_Record):
    """A gate that held a `load.until: decided` load open (a key gate, or a blocking gate
    with data), as the last look saw it (gates/standing.py)."""

    id: Text
    key: Flag | None = None  # a key gate (records written before blocking gates held: absent)
    decision: Literal["PASS", "FAIL", "UNDECIDED", "N/A"]
    settled: Flag  # by its anytime bound, by observation (a count, a max), or N/A
    settled_by: Text | None = None
    n: Count  # records examined
    needs_n: Count | None = None  # about how many a decision needs; None: out of reach
    bound: Text | None = None  # the anytime-valid bound, "[lo, hi] (method)"


class Until(_Record):
    """How a load that runs until its gates are decided ended (harness/live/until.py): the
    rule and its limits, whether every gate that held it open was decided at one look, when,
    and why the load stopped; those gates as that look, or the last one, saw them."""

    rule: Literal["decided"] = "decided"
    min_duration_s: Number
    max_duration_s: Number
    decided: Flag  # every held gate settled at one look (or one decided FAIL)
    decided_at_s: Number | None = None  # seconds into the load of the look that decided
    looked_at_s: Number | None = None  # seconds into the load of the last look
    looks: Count = 0
    resumed: Count = 0  # boundaries at which a held gate was still undecided: the shape went on
    stopped_at_s: Number | None = None  # seconds into the load; None while it runs
    stopped_because: Text | None = None
    gates: list[UntilGate] | None = None


class LoopLagMs(_Record):
    """How late the load generator's event loop woke over the load, in milliseconds
    (harness/looplag.py): p50 and p99 of its ticks, to the millisecond above, and the most."""

    ticks: Count | None = None
    p50: Number | None = None
    p99: Number | None = None
    max: Number | None = None


class LoadGeneratorMeta(_Record):
    mode: Literal["local", "distributed"] | None = None
    processes: Count | None = None  # local worker processes
    stopped_early: Text | None = None  # why the load stopped before its planned end, if it did
    loop_lag_ms: LoopLagMs | None = None  # every load-generator process's, merged
    loop_lag_bound_ms: Number | None = None  # samplers.loop_lag_bound_ms


class Records(_Record):
    """What the record sink counted: rows written, duplicates dropped, and by what."""

    written: Count | None = None
    duplicates_dropped: Count | None = None
    by_worker: dict[str, Count] | None = None
    by_class: dict[str, Count] | None = None
    outcomes: dict[str, Count] | None = None
    relay: dict[str, dict[str, Count]] | None = None  # distributed: sent, received, lost


class ScheduleError(_Record):
    """How late a replay's requests went, `t_send - t_scheduled`, in milliseconds."""

    p50: Number | None = None
    p99: Number | None = None
    max: Number | None = None


class Replay(_Record):
    """A replayed trace (traffic.trace): what was planned, what went out, how punctually,
    and the prefix reuse the trace implies beside the one the server reported."""

    trace: Text | None = None  # the trace file
    format: Text | None = None
    block_tokens: Count | None = None  # the replay's block size (scaled); None: no blocks
    time_scale: Number | None = None
    token_scale: Number | None = None
    in_window: Count | None = None  # the trace's requests in the replayed window
    scheduled: Count | None = None  # requests the replay planned to send
    clipped: Count | None = None  # inputs cut to max_input_tokens
    skipped: Count | None = None  # requests over max_input_tokens not sent (over_max: skip)
    unmatched: Count | None = None  # requests no rule matched, not sent
    sent: Count | None = None  # requests recorded with a planned send time
    unsent: Count | None = None  # planned, never sent (the load ended first)
    stragglers: Count | None = None  # sent, still running when the load ended (cancelled)
    schedule_error_ms: ScheduleError | None = None
    schedule_error_bound_ms: Number | None = None  # samplers.schedule_error_bound_ms
    # Shares of the prompt tokens sent: in blocks an earlier request had sent (the trace's
    # own reuse), and the cached tokens the server reported over the prompt tokens it counted
    prefix_reuse_trace: Number | None = None
    prefix_reuse_server: Number | None = None
    blocks_checked: Count | None = None  # blocks tokenized together before the load
    blocks_exact: Flag | None = None  # they came to exactly their size; None: no tokenizer
    # the load generator's CPU over the load, in cores (kvgate's process tree)
    load_generator_cpu_cores_mean: Number | None = None
    load_generator_cpu_cores_max: Number | None = None


class RunMeta(_Record):
    """meta.json. Every field may be absent on read; one that is there has its type."""

    status: RunStatus | None = None
    error: Text | None = None  # the one-line reason of an `error` or `interrupted` run
    plan: dict[str, Any] | None = None  # the resolved plan (harness/plan.py's Plan as JSON)
    target: TargetMeta | None = None
    # The server profile the run used, as the harness resolved it when the run started:
    # contract.servers.ServerProfile as JSON. gates/run_profile.py reads it back, and refuses
    # one it cannot read with the way out, so here it is only an object.
    target_profile: dict[str, Any] | None = None
    harness_version: Text | None = None
    versions: dict[str, Text] | None = None  # python and each package that matters
    hosts: list[Host] | None = None
    gpus: list[Gpu] | None = None
    t_start: Number | None = None
    t_end: Number | None = None
    seed: Count | None = None
    cpu_warning: Flag = False
    cpu_warnings: list[CpuWarning] | None = None
    sim_lag_ms_p99: Number | None = None
    sim_lag_ms_max: Number | None = None
    sim_lag_bound_ms: Number | None = None
    # The plan's bounds on other processes' CPU (samplers.foreign_cpu_bound_share and
    # samplers.foreign_cpu_window_bound_share): shares of the host's CPUs, which the
    # host-contention check judges the run's host samples by.
    foreign_cpu_bound_share: Number | None = None
    foreign_cpu_window_bound_share: Number | None = None
    # "stress", "idle_before", "after_load": [t0, t1] epoch seconds, or None when not reached
    windows: dict[str, tuple[Number, Number] | None] | None = None
    phases: list[Phase] | None = None
    capacity: Capacity | None = None
    aborted: Aborted | None = None
    until: Until | None = None  # load.until: decided only
    load_generator: LoadGeneratorMeta | None = None
    records: Records | None = None
    tables: dict[str, Count] | None = None  # rows per table after compaction
    # Tokens in one block of the requests' `prompt_blocks` (a replayed trace's own block
    # size); None when no request carries blocks.
    prompt_block_tokens: Count | None = None
    replay: Replay | None = None  # traffic.trace only

    @classmethod
    def read(cls, meta: dict[str, Any]) -> RunMeta:
        """`meta` as a reader takes it: fields not named here are kept; pydantic's
        ValidationError names each field of the wrong type."""
        return cls.model_validate(meta, context={_READING: True})

    def dumped(self) -> dict[str, Any]:
        """The JSON object meta.json holds: the fields that were given, as given."""
        plain: dict[str, Any] = self.model_dump(mode="json", exclude_unset=True)
        return plain
