"""Load shapes driven by a fake clock: each ends by itself and records what it did."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from locust import User, constant, task
from locust.env import Environment

from contract import Outcome
from tests.classes import subclass
from tests.waiting import wait_until
from workloads.client import StreamResult
from workloads.records import RequestMeta, build_record, install_record_hook
from workloads.shapes import PeakTroughShape, RecordingShape, SoakShape, StepRampShape


class Online(User):
    traffic_class = "short_qa"
    wait_time = constant(0.5)

    @task
    def idle(self) -> None:
        """No traffic: these tests only count users."""


class Offline(Online):
    traffic_class = "batch"


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def stand_in(shape: RecordingShape, runner: SimpleNamespace) -> FakeClock:
    """Gives `shape` a fake clock and `runner` in place of Locust's, which needs a live test."""
    clock = FakeClock()
    shape.get_run_time = clock  # type: ignore[method-assign]  # the fake clock is the point
    shape.runner = runner  # type: ignore[assignment]  # only the attributes a shape reads
    return clock


def attach(shape: RecordingShape) -> tuple[FakeClock, Environment]:
    env = Environment(user_classes=[Online, Offline])
    return stand_in(shape, SimpleNamespace(environment=env)), env


def drive(shape: RecordingShape, clock: FakeClock, until_s: float) -> list[Any]:
    ticks = []
    while clock.t <= until_s:
        tick = shape.tick()
        ticks.append(tick)
        if tick is None:
            break
        clock.t += 1.0
    return ticks


def fire(
    env: Environment,
    shape: RecordingShape,
    outcome: str,
    count: int,
    status: int | None = None,
    code: str | None = None,
    ttft_s: float | None = None,
    klass: str = "batch",
) -> None:
    meta = RequestMeta(klass, "batchco", "batch", None, 8, 8, "batch")
    for _ in range(count):
        result = StreamResult(
            request_id="r", t_send=shape.now_epoch() + 0.25, outcome=Outcome(outcome)
        )
        result.http_status, result.error_code, result.ttft_s = status, code, ttft_s
        install_record_hook(env).fire(record=build_record(meta, result))


def test_step_ramp_stops_after_rejections_start_and_records_the_load() -> None:
    shape = subclass("Ramp", StepRampShape, {"step_s": 10, "overload_steps": 1})()
    clock, env = attach(shape)
    while True:
        tick = shape.tick()
        if tick is None:
            break
        users = tick[0]
        # The server rejects 10 % of requests from 40 users on, and never times out.
        fire(env, shape, "ok", 30)
        fire(env, shape, "rejected", 4 if users >= 40 else 0, status=503)
        clock.t += 1.0
        assert clock.t < 200, "the ramp never stopped"
    assert shape.finished and shape.stop_reason == "rejections"
    assert shape.rejection_started_users == 40 and shape.timeouts_started_users is None
    assert [s["users"] for s in shape.steps] == [10, 20, 30, 40, 50]
    assert [p["name"] for p in shape.phases] == [f"step_{i}" for i in range(5)]
    assert all(p["t1"] is not None and p["t1"] > p["t0"] > 1e9 for p in shape.phases)
    assert shape.tick() is None


def test_the_capacity_knee_is_where_capacity_refusals_start_not_one_tenants_quota() -> None:
    shape = subclass("Ramp", StepRampShape, {"step_s": 10, "overload_steps": 1})()
    clock, env = attach(shape)
    while (tick := shape.tick()) is not None:
        users = tick[0]
        fire(env, shape, "ok", 30)
        # one tenant over its quota from 20 users on; the pool full from 50
        fire(env, shape, "rejected", 3 if users >= 20 else 0, status=429, code="tenant_quota")
        fire(env, shape, "rejected", 3 if users >= 50 else 0, status=503, code="capacity")
        clock.t += 1.0
        assert clock.t < 300, "the ramp never stopped"
    assert shape.policy_rejection_started_users == 20 and shape.rejection_started_users == 50
    assert shape.stop_reason == "rejections" and shape.steps[-1]["users"] == 60
    assert shape.steps[-1]["rejected_policy"] > 0 and shape.steps[-1]["rejected_capacity"] > 0


def test_a_step_past_the_ttft_slo_is_a_knee_too() -> None:
    shape = subclass("Ramp", StepRampShape, {"step_s": 10, "slo_ttft_p95_s": 0.9})()
    clock, env = attach(shape)
    while (tick := shape.tick()) is not None:
        fire(env, shape, "ok", 30, ttft_s=0.3 if tick[0] < 40 else 1.5)
        clock.t += 1.0
        assert clock.t < 300, "the ramp never stopped"
    assert shape.slo_broken_users == 40 and shape.rejection_started_users is None
    assert shape.stop_reason == "slo" and shape.steps[2]["ttft_p95_s"] == 0.3


def test_a_request_the_server_never_answered_breaks_the_slo_like_the_gates_say() -> None:
    """From 40 users one request in ten fails with a 500 and no first token: slower than any
    line, as the ttft gate counts it (+inf), though every answered one is fast. A client's own
    cancel with no first token is left out, so it breaks nothing."""
    shape = subclass("Ramp", StepRampShape, {"step_s": 10, "slo_ttft_p95_s": 0.9})()
    clock, env = attach(shape)
    while (tick := shape.tick()) is not None:
        fire(env, shape, "ok", 27, ttft_s=0.3)
        fire(env, shape, "cancelled", 3)
        fire(env, shape, "error", 3 if tick[0] >= 40 else 0, status=500)
        clock.t += 1.0
        assert clock.t < 600, "the ramp never stopped"
    assert shape.slo_broken_users == 40 and shape.stop_reason == "slo"
    assert shape.steps[2]["ttft_p95_s"] == 0.3 and shape.steps[3]["ttft_p95_s"] == float("inf")
    assert shape.timeouts_started_users is None and shape.rejection_started_users is None


def test_the_slo_knee_reads_only_the_classes_it_is_for() -> None:
    """32K-token prompts take seconds to prefill at any load: with the SLO on the questions,
    their TTFT neither ends the ramp at its first step nor hides the questions' knee."""
    attrs = {"step_s": 10, "slo_ttft_p95_s": 0.9, "slo_traffic_classes": ("short_qa",)}
    shape = subclass("Ramp", StepRampShape, attrs)()
    clock, env = attach(shape)
    while (tick := shape.tick()) is not None:
        fire(env, shape, "ok", 30, ttft_s=0.3 if tick[0] < 40 else 1.5, klass="short_qa")
        fire(env, shape, "ok", 10, ttft_s=3.1, klass="long_context")
        clock.t += 1.0
        assert clock.t < 300, "the ramp never stopped"
    assert shape.slo_broken_users == 40 and shape.stop_reason == "slo"
    assert shape.steps[2]["ttft_p95_s"] == 0.3


def test_the_recorded_knees_are_judged_on_every_record_of_each_step() -> None:
    """The live knee is decided on a step still filling: here the first step's slow start
    crosses the SLO, and its later records bring it back under. meta.capacity must record
    the knee the whole steps show, which agrees with the bisection's bracket."""
    attrs = {"step_s": 10, "slo_ttft_p95_s": 0.9, "bisect_steps": 2, "overload_steps": 1}
    shape = subclass("Ramp", StepRampShape, attrs)()
    clock, env = attach(shape)
    first_tick = True
    while (tick := shape.tick()) is not None:
        users = tick[0]
        if first_tick:  # 22 slow answers: enough for the live check to call a knee
            fire(env, shape, "ok", 22, ttft_s=1.5)
            first_tick = False
        else:  # then 9 s of fast ones: 3.9% slow over the whole step, p95 under the line
            fire(env, shape, "ok", 60, ttft_s=1.5 if users >= 16 else 0.3)
        clock.t += 1.0
        assert clock.t < 400, "the ramp never stopped"
    assert shape.slo_broken_users == 10  # the live alarm, which steered the ramp
    knees = shape.knees()
    assert shape.steps[0]["users"] == 10 and shape.steps[0]["ttft_p95_s"] == 0.3
    broken = [s["users"] for s in shape.steps if s["ttft_p95_s"] > 0.9]
    assert knees["slo_broken_users"] == min(broken) > 10
    assert knees["capacity_users"] is not None and knees["slo_broken_users"] is not None
    assert knees["capacity_users"] < knees["slo_broken_users"] == knees["capacity_bound_users"]
    assert set(knees) == set(StepRampShape.KNEES)


def test_bisection_brackets_the_capacity_between_the_ramp_steps() -> None:
    attrs = {"step_s": 10, "bisect_steps": 4, "bisect_resolution_users": 2, "overload_steps": 0}
    shape = subclass("Ramp", StepRampShape, attrs)()
    clock, env = attach(shape)
    while (tick := shape.tick()) is not None:
        fire(env, shape, "ok", 30)
        # the pool holds 33 users: refusals from 34 on
        fire(env, shape, "rejected", 3 if tick[0] >= 34 else 0, status=503, code="capacity")
        clock.t += 1.0
        assert clock.t < 400, "the search never ended"
    assert [s["users"] for s in shape.steps] == [10, 20, 30, 40, 35, 32, 33]
    assert (shape.capacity_users, shape.capacity_bound_users) == (33, 35)
    assert shape.stop_reason == "bisected" and shape.rejection_started_users == 40


def test_step_ramp_stops_at_once_when_timeouts_start() -> None:
    shape = subclass("Ramp", StepRampShape, {"step_s": 5, "min_requests": 5})()
    clock, env = attach(shape)
    for _ in range(100):
        tick = shape.tick()
        if tick is None:
            break
        fire(env, shape, "ok", 10)
        if tick[0] >= 30:
            fire(env, shape, "timeout", 1)
        clock.t += 1.0
    assert shape.stop_reason == "timeouts" and shape.timeouts_started_users == 30
    assert shape.rejection_started_users is None


def test_step_ramp_ends_at_max_users_without_trouble() -> None:
    shape = subclass("Ramp", StepRampShape, {"step_s": 2, "max_users": 35})()
    clock, _env = attach(shape)
    ticks = drive(shape, clock, 100)
    assert ticks[-1] is None and shape.stop_reason == "max_users"
    assert max(t[0] for t in ticks if t) == 35
    assert shape.rejection_started_users is None


def test_soak_ramps_holds_cools_down_and_ends() -> None:
    soak = subclass("Soak", SoakShape, {"users": 20, "spawn_rate": 10, "duration_s": 10})
    shape = subclass("Soak", soak, {"cooldown_s": 3})()
    clock, _env = attach(shape)
    ticks = drive(shape, clock, 100)
    assert ticks[-1] is None and clock.t == 13
    assert ticks[:-1] == [(20, 10)] * 10 + [(0, 10)] * 3
    assert [p["name"] for p in shape.phases] == ["ramp", "soak", "cooldown"]
    assert shape.phases[1]["t0"] - shape.phases[0]["t0"] == pytest.approx(2.0)


def test_peak_trough_moves_batch_users_opposite_to_online_ones() -> None:
    shape = subclass(
        "PT",
        PeakTroughShape,
        {
            "peak_s": 4,
            "trough_s": 4,
            "cycles": 2,
            "spawn_rate": 5,
            "peak_users": 8,
            "trough_users": 3,
            "trough_batch_users": 5,
        },
    )()
    clock, _env = attach(shape)
    ticks = drive(shape, clock, 100)
    assert ticks[-1] is None and clock.t == 16
    assert ticks[:-1] == [
        (8, 5, [Online]),  # peak: online only
        (8, 5, [Online]),
        (8, 5, [Online]),
        (8, 5, [Online]),
        (3, 5, [Online]),  # trough: fewer online users, then batch users on top
        (8, 5, [Offline]),
        (8, 5, [Offline]),
        (8, 5, [Offline]),
        (3, 5, [Offline]),  # peak: the batch users (started last) stop first
        (8, 5, [Online]),
        (8, 5, [Online]),
        (8, 5, [Online]),
        (3, 5, [Online]),
        (8, 5, [Offline]),
        (8, 5, [Offline]),
        (8, 5, [Offline]),
    ]
    assert [p["name"] for p in shape.phases] == ["peak", "trough", "peak", "trough"]


class Preemptor(Online):
    """An online traffic class the plan runs only while batch work is there."""


def test_peak_trough_runs_named_trough_classes_with_the_batch_users() -> None:
    shape = subclass(
        "PT",
        PeakTroughShape,
        {
            "peak_s": 2,
            "trough_s": 2,
            "cycles": 1,
            "spawn_rate": 5,
            "peak_users": 4,
            "trough_users": 4,
            "trough_batch_users": 3,
            "trough_classes": ("Preemptor",),
        },
    )()
    env = Environment(user_classes=[Online, Offline, Preemptor])
    clock = stand_in(shape, SimpleNamespace(environment=env))
    ticks = drive(shape, clock, 100)
    assert ticks[:-1] == [
        (4, 5, [Online]),  # peak: the trough class does not run
        (4, 5, [Online]),
        (4, 5, [Online]),  # trough: online users, then batch and trough classes on top
        (7, 5, [Offline, Preemptor]),
    ]


def test_a_transition_step_waits_until_the_runner_reaches_its_count() -> None:
    """Locust restarts its ramp on every new tick, so a step must not be cut short."""
    shape = subclass(
        "PT",
        PeakTroughShape,
        {
            "peak_s": 2,
            "trough_s": 60,
            "cycles": 1,
            "spawn_rate": 2,
            "peak_users": 4,
            "trough_users": 10,
            "trough_batch_users": 4,
        },
    )()
    runner = SimpleNamespace(environment=Environment(user_classes=[Online, Offline]), user_count=4)
    clock = stand_in(shape, runner)
    seen = []
    for count in (4, 4, 4, 6, 8, 10, 12):
        runner.user_count = count
        seen.append(shape.tick())
        clock.t += 1.0
    online, batch = (10, 2, [Online]), (14, 2, [Offline])
    # the peak's two ticks, then the trough: batch users start once all 10 online users run
    assert seen == [(4, 2, [Online])] * 2 + [online] * 3 + [batch] * 2


def test_peak_trough_moves_batch_users_in_a_real_locust_run() -> None:
    shape = subclass(
        "PT",
        PeakTroughShape,
        {
            "peak_s": 3.0,
            "trough_s": 3.0,
            "cycles": 1,
            "peak_users": 6,
            "trough_users": 2,
            "trough_batch_users": 4,
            "spawn_rate": 100,
        },
    )()
    env = Environment(user_classes=[Online, Offline], shape_class=shape)
    runner = env.create_local_runner()
    counts: list[tuple[str, dict[str, int]]] = []

    def sample_until_the_shape_ends() -> bool:
        if shape.phases and not shape.finished:
            counts.append((shape.phases[-1]["name"], dict(runner.user_classes_count)))
        return runner.shape_greenlet is None

    try:
        runner.start_shape()
        # The shape runs 6 s of real time: the deadline is for a hung run only.
        wait_until(sample_until_the_shape_ends, timeout_s=90, what="the shape to end")
    finally:
        runner.quit()
    assert shape.finished
    assert ("peak", {"Online": 6, "Offline": 0}) in counts
    assert ("trough", {"Online": 2, "Offline": 4}) in counts


def peak_trough(cycles: int) -> PeakTroughShape:
    attrs = {"peak_s": 4, "trough_s": 4, "cycles": cycles, "spawn_rate": 5, "peak_users": 8,
             "trough_users": 3, "trough_batch_users": 0}  # fmt: skip
    return subclass("PT", PeakTroughShape, attrs)()


def test_asked_to_end_a_peak_trough_shape_runs_its_cycle_out_and_holds() -> None:
    """Asked during its first cycle, not before 10 s: it ends with its second whole cycle
    (16 s), its last phase closed there, and holds its users until the harness stops them;
    the planned cycles beyond are not run."""
    shape = peak_trough(cycles=5)
    clock, _env = attach(shape)
    drive(shape, clock, 2)
    assert shape.end_at_boundary(not_before_s=10) == 16
    assert shape.end_at_boundary(not_before_s=30) == 16  # asking again changes nothing
    ticks = drive(shape, clock, 30)
    assert not shape.finished and shape.parked
    assert ticks[-1] == ticks[-2] == (3, 5, [Online])  # held: the last trough's users
    assert [p["name"] for p in shape.phases] == ["peak", "trough"] * 2
    last = shape.phases[-1]
    assert last["t1"] - shape.epoch_start == 16.0  # closed at the boundary, not at the stop
    shape.finish()  # the harness stops the load
    assert shape.phases[-1]["t1"] == last["t1"] and shape.tick() is None


def test_asked_after_a_phase_changed_it_ends_with_the_cycle_now_running() -> None:
    shape = peak_trough(cycles=5)
    clock, _env = attach(shape)
    drive(shape, clock, 9)  # the second cycle's peak began at 8 s
    assert shape.end_at_boundary() == 16


def test_asked_to_end_a_step_ramp_ends_with_the_step_now_running() -> None:
    shape = subclass("Ramp", StepRampShape, {"step_s": 10, "max_users": 500})()
    clock, _env = attach(shape)
    drive(shape, clock, 12)
    assert shape.end_at_boundary(not_before_s=5) == 20
    ticks = drive(shape, clock, 40)
    assert shape.parked and not shape.finished and ticks[-1] == (20, 10)
    assert [s["users"] for s in shape.steps] == [10, 20]
    assert shape.steps[-1]["t1"] - shape.epoch_start == 20.0


def test_asked_to_end_a_soak_ends_its_hold_then_cools_down() -> None:
    soak = subclass("Soak", SoakShape, {"users": 20, "spawn_rate": 10, "duration_s": 100})
    shape = subclass("Soak", soak, {"cooldown_s": 3})()
    clock, _env = attach(shape)
    drive(shape, clock, 5)
    assert shape.end_at_boundary(not_before_s=8) == 11  # a hold to 8 s, then the cooldown
    ticks = drive(shape, clock, 20)  # from 6 s on
    assert ticks[:2] == [(20, 10)] * 2 and ticks[2:5] == [(0, 10)] * 3
    assert shape.parked and ticks[-1] == (0, 10)  # held at zero users once cooled down
    assert [p["name"] for p in shape.phases] == ["ramp", "soak", "cooldown"]
    assert shape.phases[-1]["t1"] - shape.epoch_start == 11.0


def test_resumed_after_a_boundary_the_shape_goes_on_with_whole_phases() -> None:
    """Held 3 s at the end of its first cycle, then resumed: the next peak begins then and
    every phase keeps its 4 s; the shape's clock leaves the hold out, so it ends its five
    cycles 3 s later than it would have."""
    shape = peak_trough(cycles=5)
    clock, _env = attach(shape)
    drive(shape, clock, 2)
    assert shape.end_at_boundary() == 8
    drive(shape, clock, 10)
    assert shape.parked
    shape.resume()
    assert not shape.parked and shape.held_s == 3.0 and shape.end_at_s is None
    ticks = drive(shape, clock, 100)
    assert ticks[-1] is None and clock.t == 43
    names = [p["name"] for p in shape.phases]
    assert names == ["peak", "trough"] * 5
    lengths = [p["t1"] - p["t0"] for p in shape.phases]
    assert lengths == [4.0] * 10
    assert shape.phases[2]["t0"] - shape.phases[1]["t1"] == 3.0  # the hold, in no phase
