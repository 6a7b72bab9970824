"""Load shapes (Locust `LoadTestShape`): step ramp until rejection, soak, peak/trough.

Each is configured by class attributes (override with `type(name, (Shape,), {...})`), ends
by itself (`tick()` returns None) and leaves what it did on the instance for the harness:

- every shape: `phases: list[dict]`, each `{"name", "t0", "t1"}` in epoch seconds (`t1` is
  None while the phase is open; the shape closes the last one when it ends) and
  `finished: bool`.
- `StepRampShape`: phase names `step_<i>`; `steps: list[dict]` with `index, users, t0, t1,
  requests, rejected, timeouts` (requests counted by the step they were sent in);
  `rejection_started_users` and `timeouts_started_users` (int | None): the target user count
  of the first step whose rejection (timeout) share reached its threshold; `stop_reason`.
- `SoakShape`: phases `ramp`, `soak` and, when `cooldown_s` > 0, `cooldown` (zero users).
- `PeakTroughShape`: phases `peak` and `trough`, alternating `cycles` times; online and
  batch classes get their own user counts per phase (by default batch users stop at the
  peak and rise in the trough). `trough_classes` names further user classes (by class
  name, e.g. a critical service that only runs while batch work is there to preempt) that
  follow the batch counts. (A class that should send only in some phases while its users
  stay up — daytime long-context traffic — sets its users' `phases` instead.)

Any shape can be asked to end early at its next boundary (`end_at_boundary`, for a load that
runs until its gates are decided): the end of a whole peak/trough cycle, of a ramp step, or,
for a soak, any moment after the ramp, followed by its cooldown. It closes its last phase
there and holds its users (`parked`) until the harness stops the load, so `phases` shows
only what really ran and no phase is cut short. A peak/trough shape or a ramp may be told
to go on instead (`resume`, when the look taken at the boundary leaves a gate undecided):
its next phase begins then, and its clock (`clock_s`) leaves out the time it held, so every
phase keeps its length.

The ramp learns rejection and timeout rates live from `environment.events.kvgate_record`.
"""

from __future__ import annotations

import bisect
import math
import time
from typing import Any, ClassVar

from locust import LoadTestShape, User

import contract
from contract import Outcome, RequestRecord
from contract.quantiles import censored_latency, percentile
from workloads.records import install_record_hook

# What a shape's tick returns: users and spawn rate, and the user classes the step runs
# (None: all of them); a tick of None ends the run.
Step = tuple[int, float] | tuple[int, float, list[type[User]] | None]
Tick = Step | None
# Beyond its ramp time, how long a transition step may wait for the runner to reach its count.
STEP_GRACE_S = 5.0


class RecordingShape(LoadTestShape):
    """Base: a clock in epoch seconds and the list of phases the shape went through."""

    abstract = True
    # Whether a load that runs until decided looks again once this shape has reached its
    # boundary, and resumes it when a gate is still undecided: true for shapes whose boundary
    # lies ahead of the look that asked for it (the end of a cycle, of a step).
    confirms_at_boundary: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.epoch_start = time.time()
        self.phases: list[dict[str, Any]] = []
        self.finished = False
        # Asked to end early: the run time it ends at (None: it runs its planned course), and
        # whether it got there (its last phase then is closed, and it holds its users).
        self.end_at_s: float | None = None
        self.parked = False
        self.held_s = 0.0  # seconds spent parked before a resume, left out of `clock_s`
        self._parked_since = 0.0

    def reset_time(self) -> None:
        super().reset_time()
        self.epoch_start = time.time()

    def get_run_time(self) -> float:
        """Seconds since the shape's clock started (Locust's clock, which is unannotated)."""
        run_time: float = super().get_run_time()
        return run_time

    def now_epoch(self) -> float:
        return self.epoch_start + self.get_run_time()

    def clock_s(self) -> float:
        """The shape's own time: its run time less the seconds it held at a boundary."""
        return self.get_run_time() - self.held_s

    def enter_phase(self, name: str) -> None:
        if self.phases and self.phases[-1]["name"] == name and self.phases[-1]["t1"] is None:
            return
        now = self.now_epoch()
        self._close_phase(now)
        self.phases.append({"name": name, "t0": now, "t1": None})

    def end_at_boundary(self, not_before_s: float = 0.0) -> float:
        """Ask the shape to end at its next boundary, and not before `not_before_s` (on its
        clock); the run time it will end at. Asking again changes nothing."""
        if self.end_at_s is None:
            self.end_at_s = self.next_boundary_s(not_before_s)
        return self.end_at_s

    def next_boundary_s(self, not_before_s: float) -> float:
        """The first time on the shape's clock, not before `not_before_s`, at which it may end
        without cutting short a stretch that gates judge whole: any moment, for a shape that
        has none."""
        return max(not_before_s, self.clock_s())

    def resume(self) -> None:
        """Go on from the boundary the shape is parked at, as if it had never stopped there:
        its next phase begins now. (Only shapes whose boundaries are ahead of the request,
        `confirms_at_boundary`, are resumed: a soak's cooldown cannot be taken back.)"""
        if self.parked:
            self.held_s += self.get_run_time() - self._parked_since
        self.parked, self.end_at_s = False, None

    def _park(self) -> bool:
        """Whether the shape has reached the end it was asked for; the first time, its last
        phase is closed. A parked shape's tick holds its users: the harness stops them."""
        if not self.parked and self.end_at_s is not None and self.clock_s() >= self.end_at_s:
            self._close_phase(self.now_epoch())
            self.parked, self._parked_since = True, self.get_run_time()
        return self.parked

    def finish(self) -> None:
        if not self.finished:
            self._close_phase(self.now_epoch())
            self.finished = True

    def _close_phase(self, now: float) -> None:
        if self.phases and self.phases[-1]["t1"] is None:
            self.phases[-1]["t1"] = now


# The knees after which only `overload_steps` more steps run, and the stop reason each gives.
KNEE_CAUSES = {"rejection_started_users": "rejections", "slo_broken_users": "slo"}


class StepRampShape(RecordingShape):
    """Adds `step_users` every `step_s` until the server reaches its capacity.

    Refusals are told apart by cause (contract.rejection_cause): the capacity knee is the
    first step whose *capacity* refusals pass `rejection_threshold` (the server's own limit);
    policy refusals (one tenant's quota) are counted and their step recorded, but never end
    the ramp. With `slo_ttft_p95_s`, a step whose TTFT p95 (of `slo_traffic_classes`, or of
    every class) passes it is a knee too (the SLO knee); the p95 counts a request the server
    never answered as +inf, as the gates' TTFT does (contract.quantiles). Stops when timeouts pass
    `timeout_threshold`, `overload_steps` steps after the capacity or SLO knee (to see
    whether overload turns into timeouts), at `max_users` after its step, or at
    `max_duration_s`.

    With `bisect_steps`, the ramp then searches the knee as vLLM's SLA sweep does: up to
    that many more steps, each at the midpoint between the highest load that held
    (no capacity refusals, SLO met, no timeouts) and the lowest that did not, until they are
    `bisect_resolution_users` apart. `capacity_users` and `capacity_bound_users` bracket the
    capacity: the first held, the second did not.
    """

    abstract = False
    start_users: ClassVar[int] = 10
    step_users: ClassVar[int] = 10
    step_s: ClassVar[float] = 30.0
    max_users: ClassVar[int] = 500
    spawn_rate: ClassVar[float] = 10.0
    rejection_threshold: ClassVar[float] = 0.02
    timeout_threshold: ClassVar[float] = 0.01
    min_requests: ClassVar[int] = 20
    overload_steps: ClassVar[int] = 1
    max_duration_s: ClassVar[float] = 3600.0
    slo_ttft_p95_s: ClassVar[float | None] = None
    # The traffic classes whose TTFT the SLO knee reads (None: all). A 32K-token prefill
    # takes seconds at any load, so a mix with long context names the others here.
    slo_traffic_classes: ClassVar[tuple[str, ...] | None] = None
    bisect_steps: ClassVar[int] = 0
    bisect_resolution_users: ClassVar[int] = 2
    confirms_at_boundary: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[dict[str, Any]] = []
        self._step_starts: list[float] = []
        self._ttfts: list[list[float]] = []  # per step, TTFTs as the gates count them
        self.rejection_started_users: int | None = None  # the capacity knee
        self.policy_rejection_started_users: int | None = None
        self.slo_broken_users: int | None = None
        self.timeouts_started_users: int | None = None
        self.stop_reason: str | None = None
        self._rejection_step: int | None = None
        self._knee_cause = "rejections"
        self._listening = False
        self._probes = 0
        self.capacity_users: int | None = None
        self.capacity_bound_users: int | None = None

    def next_boundary_s(self, not_before_s: float) -> float:
        """The end of a step (each step's load is judged whole), not before `not_before_s`."""
        current = (self.steps[-1]["index"] + 1) * self.step_s if self.steps else self.step_s
        return max(current, math.ceil(not_before_s / self.step_s) * self.step_s)

    def tick(self) -> Tick:
        if self.finished:
            return None
        self._listen()
        if self._park():
            if self.steps:
                self.steps[-1]["t1"] = self.phases[-1]["t1"]
                return self.steps[-1]["users"], self.spawn_rate
            return None
        run_time = self.clock_s()
        index = int(run_time // self.step_s)
        self._judge()
        reason = self._stop_reason(run_time, index)
        if reason is None and index >= len(self.steps):
            users, reason = self._next_step(index)
            if reason is None:
                self._start_step(index, users)
        if reason is not None:
            self._bracket()
            self.stop_reason = reason
            self.finish()
            if self.steps:
                self.steps[-1]["t1"] = self.phases[-1]["t1"]
            return None
        return self.steps[-1]["users"], self.spawn_rate

    def _next_step(self, index: int) -> tuple[int, str | None]:
        """(users of the step beginning now, or why the ramp ends instead)."""
        ramp = min(self.start_users + index * self.step_users, self.max_users)
        knee = self._rejection_step
        last_index = -(-(self.max_users - self.start_users) // max(self.step_users, 1))
        if knee is None and index > max(last_index, 0):
            return ramp, "max_users"
        if knee is None or index <= knee + self.overload_steps:
            return ramp, None
        if self._probes < self.bisect_steps:
            held, failed = self._bracket()
            gap = failed - held if held is not None and failed is not None else 0
            if held is not None and failed is not None and gap > self.bisect_resolution_users:
                self._probes += 1
                return (held + failed) // 2, None
        return ramp, ("bisected" if self._probes else self._knee_cause)

    def _bracket(self) -> tuple[int | None, int | None]:
        """(highest load that held, lowest that did not), from the steps judged so far."""
        judged = [s for s in self.steps if s["requests"] >= self.min_requests]
        failed = [s["users"] for s in judged if self._step_failed(s)]
        lowest_failed = min(failed, default=None)
        held = [
            s["users"]
            for s in judged
            if not self._step_failed(s) and (lowest_failed is None or s["users"] < lowest_failed)
        ]
        self.capacity_users = max(held, default=None)
        self.capacity_bound_users = lowest_failed
        return self.capacity_users, lowest_failed

    def _step_failed(self, step: dict[str, Any]) -> bool:
        """A load that did not hold: any line crossed but one tenant's quota (policy)."""
        crossed = self._crossed(step)
        return any(hit for knee, hit in crossed.items() if knee != "policy_rejection_started_users")

    def _crossed(self, step: dict[str, Any]) -> dict[str, bool]:
        """Which lines a judged step (enough requests) crossed, by the knee each one names:
        the one rule the live knees, the bisection's bracket and meta.capacity all read."""
        n = step["requests"]
        slo, p95 = self.slo_ttft_p95_s, step["ttft_p95_s"]
        return {
            "rejection_started_users": step["rejected_capacity"] / n >= self.rejection_threshold,
            "policy_rejection_started_users": step["rejected_policy"] / n
            >= self.rejection_threshold,
            "slo_broken_users": slo is not None and p95 is not None and p95 > slo,
            "timeouts_started_users": step["timeouts"] / n >= self.timeout_threshold,
        }

    def on_record(self, record: RequestRecord, **_kwargs: Any) -> None:
        position = bisect.bisect_right(self._step_starts, record.t_send) - 1
        if position < 0:
            return  # sent before the ramp began: not load this shape applied
        step = self.steps[position]
        step["requests"] += 1
        step["timeouts"] += record.outcome == Outcome.TIMEOUT
        if record.outcome == Outcome.REJECTED:
            step["rejected"] += 1
            cause = contract.rejection_cause(record.http_status, record.error_code)
            step[f"rejected_{cause or 'other'}"] += 1
        slo_classes = self.slo_traffic_classes
        if slo_classes is None or record.traffic_class in slo_classes:
            # As the gates count it: a request the server never answered is slower than any
            # line (+inf), not absent; a client's cancel or a 4xx refusal is left out.
            ttft = censored_latency(
                record.ttft_s,
                record.outcome,
                record.http_status,
                record.chunks,
                record.max_tokens,
            )
            if ttft is not None:
                self._ttfts[position].append(ttft)

    def _listen(self) -> None:
        if self._listening:
            return
        if self.runner is None:
            raise RuntimeError("StepRampShape needs its Locust runner before the first tick")
        install_record_hook(self.runner.environment).add_listener(self.on_record)
        self._listening = True

    def _start_step(self, index: int, users: int) -> None:
        self.enter_phase(f"step_{index}")
        t0 = self.phases[-1]["t0"]
        if self.steps and self.steps[-1]["t1"] is None:  # else it ended at a boundary
            self.steps[-1]["t1"] = t0
        self.steps.append(
            {
                "index": index,
                "users": users,
                "t0": t0,
                "t1": None,
                "requests": 0,
                "rejected": 0,
                "rejected_capacity": 0,
                "rejected_policy": 0,
                "rejected_other": 0,
                "timeouts": 0,
                "ttft_p95_s": None,
            }
        )
        self._step_starts.append(t0)
        self._ttfts.append([])

    def _judge(self) -> None:
        """Finds the first steps whose rejection / timeout shares or TTFT p95 crossed their
        lines; late records can move an earlier step over, so every step is looked at again.
        A capacity or SLO knee also starts the overload steps (`_knee`)."""
        for step, ttfts in zip(self.steps, self._ttfts, strict=True):
            if step["requests"] < self.min_requests:
                continue
            if ttfts:
                step["ttft_p95_s"] = percentile(ttfts, 95)
            for knee, hit in self._crossed(step).items():
                if hit and getattr(self, knee) is None:
                    setattr(self, knee, step["users"])
                    if knee in KNEE_CAUSES:
                        self._knee(step["index"], KNEE_CAUSES[knee])

    # The lines a step can cross (`_crossed`), each named by the knee it sets, and the knees
    # meta.capacity records: those, then the bisection's bracket.
    LINES: ClassVar[tuple[str, ...]] = (
        "rejection_started_users",
        "policy_rejection_started_users",
        "slo_broken_users",
        "timeouts_started_users",
    )
    KNEES: ClassVar[tuple[str, ...]] = (*LINES, "capacity_users", "capacity_bound_users")

    def knees(self) -> dict[str, int | None]:
        """Each knee as the records so far show it, for meta.capacity: every step judged
        again, each knee the lowest load that crossed its line. The live knees above steer
        the ramp from steps still filling; a step that its late records brought back under
        the line is no knee, and a bisection probe below the first knee can be one."""
        self._judge()  # every step's TTFT p95 from all its records
        judged = [s for s in self.steps if s["requests"] >= self.min_requests]
        crossed = [(int(s["users"]), self._crossed(s)) for s in judged]
        held, failed = self._bracket()
        return {
            **{
                knee: min((users for users, hit in crossed if hit[knee]), default=None)
                for knee in self.LINES
            },
            "capacity_users": held,
            "capacity_bound_users": failed,
        }

    def _knee(self, index: int, cause: str) -> None:
        """The first step past capacity or the SLO: overload_steps more are run after it."""
        if self._rejection_step is None or index < self._rejection_step:
            self._rejection_step = index
            self._knee_cause = cause

    def _stop_reason(self, run_time: float, index: int) -> str | None:
        if run_time >= self.max_duration_s:
            return "max_duration"
        if self.timeouts_started_users is not None:
            return "timeouts"
        return None


class SoakShape(RecordingShape):
    """Ramps to `users`, holds for `duration_s` (ramp included), then `cooldown_s` at zero."""

    abstract = False
    users: ClassVar[int] = 50
    spawn_rate: ClassVar[float] = 10.0
    duration_s: ClassVar[float] = 1800.0
    cooldown_s: ClassVar[float] = 0.0

    def _ramp_s(self) -> float:
        return self.users / self.spawn_rate if self.spawn_rate > 0 else 0.0

    def next_boundary_s(self, not_before_s: float) -> float:
        """Any moment after the ramp, not before `not_before_s`; the cooldown follows, and
        the shape ends after it."""
        hold_end = max(not_before_s, self.clock_s(), min(self._ramp_s(), self.duration_s))
        return min(hold_end, self.duration_s) + self.cooldown_s

    def tick(self) -> Tick:
        if self.finished:
            return None
        if self._park():
            return (0 if self.cooldown_s else self.users), self.spawn_rate
        run_time = self.clock_s()
        hold_end = self.duration_s
        if self.end_at_s is not None:
            hold_end = min(hold_end, self.end_at_s - self.cooldown_s)
        if run_time < min(self._ramp_s(), hold_end):
            self.enter_phase("ramp")
        elif run_time < hold_end:
            self.enter_phase("soak")
        elif run_time < hold_end + self.cooldown_s:
            self.enter_phase("cooldown")
            return 0, self.spawn_rate
        else:
            self.finish()
            return None
        return self.users, self.spawn_rate


class PeakTroughShape(RecordingShape):
    """Alternates peak and trough `cycles` times. Online classes run `peak_users` /
    `trough_users` users; batch classes (`traffic_class` in `batch_traffic_classes`, plus
    `trough_classes`) run `peak_batch_users` / `trough_batch_users`, so the offline queue's
    stop at the peak and resumption in the trough can be judged.

    Locust's dispatcher stops the most recently started users first, so batch users are
    started last, and each phase change is three ticks: stop the batch users, set the online
    count, start the batch users again.
    """

    abstract = False
    peak_users: ClassVar[int] = 80
    trough_users: ClassVar[int] = 30
    peak_batch_users: ClassVar[int] = 0
    trough_batch_users: ClassVar[int] = 30
    peak_s: ClassVar[float] = 120.0
    trough_s: ClassVar[float] = 120.0
    cycles: ClassVar[int] = 2
    spawn_rate: ClassVar[float] = 20.0
    start_with_peak: ClassVar[bool] = True
    batch_traffic_classes: ClassVar[tuple[str, ...]] = ("batch",)
    trough_classes: ClassVar[tuple[str, ...]] = ()  # user class names run like batch classes
    confirms_at_boundary: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self._steps: list[Step] = []
        self._running = (0, 0)  # (online, batch) users the last completed phase asked for
        self._step_since: float | None = None  # run time the current transition step began
        self._cycle = 0  # the cycle of the phase now running (0: the first)

    def next_boundary_s(self, not_before_s: float) -> float:
        """The end of a whole cycle, not before `not_before_s`: gates that compare the peaks
        with the troughs see each as often."""
        period = self.peak_s + self.trough_s
        current = (self._cycle + 1) * period
        return max(current, math.ceil(not_before_s / period) * period)

    def tick(self) -> Tick:
        if self.finished:
            return None
        if self._park():
            return self._steps[0] if self._steps else None
        period = self.peak_s + self.trough_s
        run_time = self.clock_s()
        if run_time >= period * self.cycles:
            self.finish()
            return None
        first_s = self.peak_s if self.start_with_peak else self.trough_s
        peak = (run_time % period < first_s) == self.start_with_peak
        name = "peak" if peak else "trough"
        if not self.phases or self.phases[-1]["name"] != name:
            self._cycle = int(run_time // period)
            self.enter_phase(name)
            target = (
                (self.peak_users, self.peak_batch_users)
                if peak
                else (self.trough_users, self.trough_batch_users)
            )
            self._steps = self._transition(self._running, target)
            self._running = target
            self._step_since = None
        return self._next_step()

    def _next_step(self) -> Tick:
        """The transition's current step until the runner has reached its user count.

        Locust restarts its ramp on every new tick (a local runner kills the spawning
        greenlet), so moving on before a step's users are all started or stopped would leave
        them half-done. A runner that cannot report its count (or never gets there) is given
        the step's ramp time plus a grace period."""
        step = self._steps[0]
        if len(self._steps) == 1:
            return step
        now = self.get_run_time()
        if self._step_since is None:
            self._step_since = now
            return step
        count = getattr(self.runner, "user_count", None)
        ramp_s = abs(step[0] - (count or 0)) / step[1] + STEP_GRACE_S
        if count == step[0] or count is None or now - self._step_since >= ramp_s:
            self._steps.pop(0)
            self._step_since = now
        return self._steps[0]

    def _transition(self, now: tuple[int, int], target: tuple[int, int]) -> list[Step]:
        online_classes, batch_classes = self._split_classes()
        (online_now, batch_now), (online, batch) = now, target
        if not batch_classes:
            return [(online, self.spawn_rate, online_classes)]
        steps: list[Step] = []
        if batch_now:
            steps.append((online_now, self.spawn_rate, batch_classes))
        steps.append((online, self.spawn_rate, online_classes))
        if batch:
            steps.append((online + batch, self.spawn_rate, batch_classes))
        return steps

    def _split_classes(self) -> tuple[list[type[User]], list[type[User]]]:
        if self.runner is None:
            raise RuntimeError("PeakTroughShape needs its Locust runner before the first tick")
        classes = list(self.runner.environment.user_classes)
        batch = [
            c
            for c in classes
            if getattr(c, "traffic_class", None) in self.batch_traffic_classes
            or c.__name__ in self.trough_classes
        ]
        online = [c for c in classes if c not in batch]
        if not online:
            raise ValueError(
                "PeakTroughShape needs at least one non-batch user class for its peaks; "
                f"got only {[c.__name__ for c in classes]}"
            )
        return online, batch
