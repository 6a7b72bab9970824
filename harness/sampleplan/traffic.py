"""The traffic a plan sends, as rates worked out before any load: how many users of each
class run in each stretch of the load, and how many requests of each kind they send a second.

A closed-loop user starts its next task a wait time after its last one ended, so it runs
about 1 / (mean wait + the task's latency) tasks a second, each sending what its class's
`outline()` says. The latency is not known before the load: `Speed` is an assumption per
target (named in every figure built on it), which a previous run's measured rates replace
(harness/sampleplan/calibrate.py). Users are spread over the classes as Locust's dispatcher
spreads them, and a class restricted to some phases sends only in those.
"""

from __future__ import annotations

import inspect
import math
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from locust import User

try:
    # Locust's own order of dispatch, so the counts are those its runner starts. It is not
    # Locust's public API: tests/harness/test_sampleplan.py pins that it still matches the
    # users a plan gets, and without it the split is proportional (`_proportional`).
    from locust.dispatch import _kl_generator as _locust_order

    DispatchOrder = Callable[[list[tuple[str, float]]], Iterator[str | None]]
    _dispatch_order: DispatchOrder | None = _locust_order
except ImportError:  # pragma: no cover - a Locust that renamed it
    _dispatch_order = None

from contract import FaultEffect
from harness.plan import ExternalTarget, Plan, ReferenceTarget, VllmTarget
from harness.replay import LEAD_S
from harness.traffic import build_shape, build_user_classes
from workloads.openloop import TraceReplayUser
from workloads.sources.trace import ScheduledRequest
from workloads.users.base import KvgateUser, RequestKind

# A request whose class asks for no max_tokens streams about this many tokens, assumed.
UNBOUNDED_ANSWER_TOKENS = 256
Window = list[tuple[float, float]]  # seconds after the load starts


@dataclass(frozen=True, slots=True)
class Speed:
    """An assumed latency: a first token after `ttft_s` plus the prompt's prefill, then the
    answer at `decode_tokens_per_s`, everything times `scale` (the reference server's
    time_scale). Deliberately plain: it stands in for a measurement until there is one."""

    ttft_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    basis: str
    scale: float = 1.0

    def latency_s(self, kind: RequestKind, timeout_s: float) -> float:
        """How long one request of `kind` runs: until its answer ends, its client cancels it
        or its timeout."""
        tokens = kind.max_tokens if kind.max_tokens is not None else UNBOUNDED_ANSWER_TOKENS
        if kind.cancel_after_tokens is not None:
            tokens = min(tokens, kind.cancel_after_tokens)
        seconds = self.scale * (
            self.ttft_s
            + kind.prompt_tokens / self.prefill_tokens_per_s
            + tokens / self.decode_tokens_per_s
        )
        if kind.cancel_after_s is not None:
            seconds = min(seconds, kind.cancel_after_s)
        return min(seconds, timeout_s)


# The assumptions, per target, as (first token s, prefill tokens/s, decode tokens/s). The
# reference figures are for time_scale 1 and sit between two measured runs of the shipped
# plans: a light load (smoke.yaml) whose requests ran faster, and one that fills the KV
# pool on purpose (qualify-quick.yaml), whose requests queued for room (harness/README.md,
# "How long must a run be?", gives the ratios). vLLM's CPU build shares a core or two among
# thirty-odd sequences: a few tokens a second each. Any other server gets middling GPU
# figures. All are rough on purpose: a measured run replaces them.
REFERENCE_SPEED = (0.3, 10_000.0, 60.0)
VLLM_CPU_SPEED = (0.5, 1_000.0, 5.0)
SERVER_SPEED = (0.3, 5_000.0, 30.0)


def assumed_speed(plan: Plan) -> Speed:
    target = plan.target
    if isinstance(target, ReferenceTarget):
        scale = target.time_scale or 1.0
        basis = f"the reference server at time_scale {scale:g}"
        return _speed(REFERENCE_SPEED, basis, scale)
    if isinstance(target, VllmTarget) and target.device == "cpu":
        return _speed(VLLM_CPU_SPEED, "vLLM's CPU build")
    assert isinstance(target, ExternalTarget)
    return _speed(SERVER_SPEED, f"a server of kind {target.kind}")


def _speed(figures: tuple[float, float, float], basis: str, scale: float = 1.0) -> Speed:
    ttft, prefill, decode = figures
    text = (
        f"{basis}: first token {ttft:g} s + prompt at {prefill:g} tokens/s + answer at "
        f"{decode:g} tokens/s" + (f", times the time_scale {scale:g}" if scale != 1.0 else "")
    )
    return Speed(ttft, prefill, decode, text, scale)


@dataclass(frozen=True, slots=True)
class Span:
    """A stretch of the load with fixed user counts: `seconds` from `t0` (after the load's
    start), named as the shape names its phase ("load" for a constant load)."""

    name: str
    t0: float
    seconds: float
    users: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Stream:
    """Requests of one kind from one plan class: `per_user_s` a second per running user
    while the class sends (None: its wait time is of a form nobody can average), in the
    phases it is restricted to (empty: all)."""

    plan_class: str
    kind: RequestKind
    per_user_s: float | None
    phases: tuple[str, ...]

    def sends_in(self, span: Span) -> bool:
        return not self.phases or span.name in self.phases


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A replayed trace's requests of one rule: their kind and their send times (seconds
    after the load starts), known exactly from the trace before any load."""

    kind: RequestKind
    times: tuple[float, ...]


@dataclass(slots=True)
class TrafficModel:
    """A plan's load as spans and streams, with what the gates' counts need besides."""

    spans: list[Span]
    streams: list[Stream]
    speed: Speed
    replicas: int
    scrape_interval_s: float | None  # None: the Prometheus sampler is off
    kills: int  # faults that kill a replica
    first_fault_s: float | None  # when the first fault fires, after the load's start
    phases: dict[str, int]  # phase name -> how many times the load enters it
    notes: list[str] = field(default_factory=list)
    scheduled: list[Scheduled] = field(default_factory=list)  # a replayed trace's, by rule

    @property
    def load_s(self) -> float:
        """Seconds users send in (a ramp's first half left out)."""
        return sum(span.seconds for span in self.spans)

    @property
    def end_s(self) -> float:
        return max((span.t0 + span.seconds for span in self.spans), default=0.0)

    def requests(self, chosen: Callable[[RequestKind], bool], window: Window) -> float | None:
        """Requests of the kinds `chosen` picks sent within `window`; None when one of the
        streams it picks sends at a rate nobody can say."""
        total = 0.0
        for stream in self.streams:
            if not chosen(stream.kind):
                continue
            user_seconds = sum(
                span.users.get(stream.plan_class, 0) * _overlap(span, window)
                for span in self.spans
                if stream.sends_in(span)
            )
            if user_seconds == 0:
                continue
            if stream.per_user_s is None:
                return None
            total += user_seconds * stream.per_user_s
        for replayed in self.scheduled:
            if chosen(replayed.kind):
                total += sum(1 for t in replayed.times if any(a <= t < b for a, b in window))
        return total

    def tenants(self) -> set[str]:
        """The tenants of every stream that has users in some stretch, and a replay's."""
        running = {name for span in self.spans for name, n in span.users.items() if n}
        streams = {s.kind.tenant for s in self.streams if s.plan_class in running}
        return streams | {r.kind.tenant for r in self.scheduled if r.times}


def _overlap(span: Span, window: Window) -> float:
    t1 = span.t0 + span.seconds
    return sum(max(0.0, min(t1, b) - max(span.t0, a)) for a, b in window)


def model(plan: Plan, classes: Sequence[type[User]] | None = None) -> TrafficModel:
    """The plan's traffic; `classes` are its built user classes when the caller has them."""
    built = list(classes) if classes is not None else build_user_classes(plan, "http://127.0.0.1")
    speed = assumed_speed(plan)
    spans, notes = _spans(plan, built)
    # Without a shape there are no phases, and a class restricted to some sends all along.
    phased = plan.load.shape != "constant"
    streams = [
        stream
        for cls in built
        if not issubclass(cls, TraceReplayUser)
        for stream in _streams(cls, speed, phased)
    ]
    phases: dict[str, int] = {}
    for span in spans:
        phases[span.name] = phases.get(span.name, 0) + 1
    target = plan.target
    scrape = plan.samplers.prometheus
    scheduled = _scheduled(built, plan.load.duration_s)
    if scheduled:
        sent = sum(len(r.times) for r in scheduled)
        notes.append(
            f"the replayed trace's {sent} requests within the load are counted from the trace "
            "itself, at their scheduled times, not from assumed latencies"
        )
    return TrafficModel(
        spans=spans,
        streams=streams,
        speed=speed,
        replicas=target.replicas if isinstance(target, ReferenceTarget) else 1,
        scrape_interval_s=scrape.interval_s if scrape.enabled else None,
        kills=sum(
            f.declared_effect() == FaultEffect.KILLS
            for f in plan.faults
            if f.at_s < plan.load.duration_s
        ),
        first_fault_s=min((f.at_s for f in plan.faults), default=None),
        phases=phases,
        notes=notes,
        scheduled=scheduled,
    )


def _scheduled(built: Sequence[type[User]], duration_s: float) -> list[Scheduled]:
    """A replay's requests by rule, at the times its schedule gives, within the load."""
    replay = next((c for c in built if issubclass(c, TraceReplayUser)), None)
    if replay is None or replay.schedule is None:
        return []
    by_rule: dict[int, list[ScheduledRequest]] = {}
    for request in replay.schedule.requests:
        if LEAD_S + request.at_s < duration_s:
            by_rule.setdefault(request.rule, []).append(request)
    found = []
    for index, requests in sorted(by_rule.items()):
        rule = replay.rules[index]
        kind = RequestKind(
            count=1,
            in_series=1,
            traffic_class=rule.traffic_class,
            priority=rule.priority,
            tenant=rule.tenant,
            prompt_tokens=round(statistics.median(r.input_tokens for r in requests)),
            max_tokens=round(statistics.median(r.output_tokens for r in requests)),
        )
        found.append(Scheduled(kind, tuple(LEAD_S + r.at_s for r in requests)))
    return found


def _streams(cls: type[User], speed: Speed, phased: bool) -> list[Stream]:
    assert issubclass(cls, KvgateUser)
    outline = cls.outline()
    wait = mean_wait_s(cls.wait_time)
    latency = sum(k.in_series * speed.latency_s(k, cls.timeout_s) for k in outline.sends)
    per_task: float | None = None
    if wait is not None:
        cycle = wait + latency
        if outline.align_s:
            cycle = outline.align_s * max(1, math.ceil(cycle / outline.align_s - 1e-9))
        per_task = 1.0 / cycle if cycle > 0 else None
    return [
        Stream(
            cls.__name__,
            k,
            None if per_task is None else k.count * per_task,
            cls.phases if phased else (),
        )
        for k in outline.sends
        if k.count > 0
    ]


def mean_wait_s(wait_time: Callable[..., float]) -> float | None:
    """The mean of a Locust wait time made by `between(a, b)` or `constant(s)` (what plans
    and the classes use), read from the function's own variables; None for any other."""
    try:
        names = inspect.getclosurevars(wait_time).nonlocals
    except TypeError:
        return None
    if {"min_wait", "max_wait"} <= names.keys():
        return (float(names["min_wait"]) + float(names["max_wait"])) / 2
    if "wait_time" in names and isinstance(names["wait_time"], int | float):
        return float(names["wait_time"])
    return None


def distribute(classes: Iterable[type[User]], total: int) -> dict[str, int]:
    """How Locust's dispatcher spreads `total` users over `classes`: the fixed counts first,
    then the rest by weight, each in the dispatcher's own order."""
    classes = list(classes)
    counts = dict.fromkeys((c.__name__ for c in classes), 0)
    fixed: list[tuple[str, float]] = [(c.__name__, c.fixed_count) for c in classes if c.fixed_count]
    placed = min(total, int(sum(n for _, n in fixed)))
    for order, pairs in (
        (placed, fixed),
        (total - placed, [(c.__name__, c.weight) for c in classes if not c.fixed_count]),
    ):
        chosen = (
            _dispatch_order(pairs) if _dispatch_order is not None else _proportional(pairs, order)
        )
        for _ in range(order):
            name = next(chosen)
            if name is None:
                break
            counts[name] += 1
    return counts


def _proportional(pairs: list[tuple[str, float]], total: int) -> Iterator[str | None]:
    """`total` names in proportion to their weights (largest remainders first), then None."""
    weight = sum(w for _, w in pairs)
    if weight <= 0:
        yield None
        return
    shares = [(name, total * w / weight) for name, w in pairs]
    counts = {name: int(share) for name, share in shares}
    rest = sorted(shares, key=lambda p: p[1] - int(p[1]), reverse=True)
    for name, _share in rest[: total - sum(counts.values())]:
        counts[name] += 1
    for name, n in counts.items():
        yield from [name] * n
    yield None


def _spans(plan: Plan, classes: list[type[User]]) -> tuple[list[Span], list[str]]:
    """The load's stretches, clipped to load.duration_s (a shape that ends first ends it)."""
    load = plan.load
    shape = build_shape(plan)
    attrs: Any = shape
    notes: list[str] = []
    if load.shape == "constant":
        spans = [Span("load", 0.0, load.duration_s, distribute(classes, load.users))]
        spawn_rate = load.spawn_rate
    elif load.shape == "peak_trough":
        spans = _peak_trough(attrs, classes)
        spawn_rate = float(attrs.spawn_rate)
    elif load.shape == "soak":
        users = distribute(classes, int(attrs.users))
        spans = [Span("soak", 0.0, float(attrs.duration_s), users)]
        spawn_rate = float(attrs.spawn_rate)
    else:
        spans = _step_ramp(attrs, classes, load.duration_s)
        spawn_rate = float(attrs.spawn_rate)
        notes.append(
            "a step ramp ends at its knee, which no plan can foresee: its figures assume "
            "the ramp runs to the end of the load, so they are the most it can give"
        )
    spans = _clipped(spans, load.duration_s)
    if spans and spawn_rate > 0:
        # users start one after another: the first stretch loses half its ramp
        first = spans[0]
        ramp = min(sum(first.users.values()) / spawn_rate, first.seconds)
        spans[0] = Span(first.name, first.t0 + ramp / 2, first.seconds - ramp / 2, first.users)
    return spans, notes


def _clipped(spans: list[Span], duration_s: float) -> list[Span]:
    kept = []
    for span in spans:
        seconds = min(span.seconds, duration_s - span.t0)
        if seconds > 0:
            kept.append(Span(span.name, span.t0, seconds, span.users))
    return kept


def _peak_trough(shape: Any, classes: list[type[User]]) -> list[Span]:
    batch_classes = [
        c
        for c in classes
        if getattr(c, "traffic_class", None) in shape.batch_traffic_classes
        or c.__name__ in shape.trough_classes
    ]
    online = [c for c in classes if c not in batch_classes]
    users = {
        "peak": {
            **distribute(online, int(shape.peak_users)),
            **distribute(batch_classes, int(shape.peak_batch_users)),
        },
        "trough": {
            **distribute(online, int(shape.trough_users)),
            **distribute(batch_classes, int(shape.trough_batch_users)),
        },
    }
    order = ("peak", "trough") if shape.start_with_peak else ("trough", "peak")
    seconds = {"peak": float(shape.peak_s), "trough": float(shape.trough_s)}
    spans, t0 = [], 0.0
    for _ in range(int(shape.cycles)):
        for name in order:
            spans.append(Span(name, t0, seconds[name], users[name]))
            t0 += seconds[name]
    return spans


def _step_ramp(shape: Any, classes: list[type[User]], duration_s: float) -> list[Span]:
    step_s = float(shape.step_s)
    end = min(duration_s, float(shape.max_duration_s))
    spans, index = [], 0
    while index * step_s < end:
        users = min(int(shape.start_users) + index * int(shape.step_users), int(shape.max_users))
        spans.append(Span(f"step_{index}", index * step_s, step_s, distribute(classes, users)))
        index += 1
    return spans
