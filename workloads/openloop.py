"""Open-loop sending: each request goes out at its planned time, whatever the answers before.

`OpenLoop` sends a schedule: it prepares each request ahead (its prompt text), sleeps until
the request is due, and hands it to a greenlet of its own, so a slow answer never delays
the next send. `TraceReplayUser` is the Locust user that replays a trace's schedule with
it: one per load-generator process, each sending its share (request i goes to share
i mod shares), all counting from one start time (`ReplayStart`), which the harness gives.
Every request it starts records its ending, and its planned time as `t_scheduled`, so the
schedule error (`t_send - t_scheduled`) is measured per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

import gevent
from gevent.event import AsyncResult
from gevent.pool import Group
from locust import constant, task
from locust.env import Environment
from locust.exception import StopUser
from locust.user.task import LOCUST_STATE_STOPPING

from workloads.block_ids import BLOCK_TOKENS
from workloads.blocks import BlockText
from workloads.sources.trace import Rule, Schedule, ScheduledRequest
from workloads.users.base import Caller, KvgateUser

Item = TypeVar("Item")
Prepared = TypeVar("Prepared")
START_ATTRIBUTE = "kvgate_replay_start"  # the environment's start signal (an AsyncResult)
CLAIM_ATTRIBUTE = "kvgate_replay_claimed"  # set once a user of this process replays
POLL_S = 0.5  # how often a waiting replay looks whether its user is stopping
SPIN_S = 0.002  # the end of each wait for a send, spent yielding rather than on a timer
PREFIX_HEADER = "X-Kvgate-Prefix-Tokens"


@dataclass(frozen=True, slots=True)
class ReplayStart:
    """When the schedule's time 0 is (epoch s), and which share of it this process sends."""

    t0: float
    share: int = 0
    shares: int = 1

    def mine(self, requests: Sequence[Item]) -> Sequence[Item]:
        return requests[self.share :: self.shares]


def replay_start(environment: Environment) -> AsyncResult[ReplayStart]:
    """The environment's start signal: the harness sets a ReplayStart on it (idempotent)."""
    found = getattr(environment, START_ATTRIBUTE, None)
    if found is None:
        signal: AsyncResult[ReplayStart] = AsyncResult()
        setattr(environment, START_ATTRIBUTE, signal)
        return signal
    assert isinstance(found, AsyncResult), f"{START_ATTRIBUTE} is taken by something else"
    return found


class OpenLoop(Generic[Item, Prepared]):
    """Sends `items` at `t0 + at(item)`, each on its own greenlet.

    Invariant: a request is either sent (`sent`), or counted as not sent (`unsent`) when the
    loop is stopped; after `stop()`, no request it sent is still running (each recorded its
    ending as it was killed), and `stragglers` counts the ones that had to be killed."""

    def __init__(
        self,
        items: Sequence[Item],
        t0: float,
        at: Callable[[Item], float],
        prepare: Callable[[Item], Prepared],
        send: Callable[[Item, float, Prepared], object],
    ) -> None:
        self.items, self.t0, self.at = items, t0, at
        self.prepare, self.send = prepare, send
        self.group = Group()
        self.sent = self.unsent = self.stragglers = 0

    def run(self, stopping: Callable[[], bool]) -> None:
        """Sends every item at its time, until done or `stopping()` says so."""
        for i, item in enumerate(self.items):
            prepared = self.prepare(item)  # before the wait: the send itself is not delayed
            due = self.t0 + self.at(item)
            while (delay := due - time.time()) > 0 and not stopping():
                # A timer wakes this greenlet only once the loop gets round to it, a
                # millisecond or more late on a busy one: the last SPIN_S are waited out by
                # yielding to the other greenlets until the moment has come.
                gevent.sleep(min(delay - SPIN_S, POLL_S) if delay > SPIN_S else 0)
            if stopping():
                self.unsent = len(self.items) - i
                return
            self.group.spawn(self.send, item, due, prepared)
            self.sent += 1
            gevent.sleep(0)  # the send's greenlet runs now, up to its first wait on the wire

    def drain(self, stopping: Callable[[], bool]) -> None:
        """Waits for the requests sent to end, until `stopping()` says so."""
        while len(self.group) and not stopping():
            self.group.join(timeout=POLL_S)

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stragglers += len(self.group)
        self.group.kill(block=True, timeout=timeout_s)


class TraceReplayUser(KvgateUser):
    """Replays a trace's schedule open loop; the harness builds it from the plan's
    `traffic.trace` (it is no traffic class a plan names: its requests carry the traffic
    class, tenant and priority of the rule each matched)."""

    abstract = True
    label: ClassVar[str] = "replay"
    schedule: ClassVar[Schedule | None] = None
    rules: ClassVar[tuple[Rule, ...]] = ()
    ignore_eos: ClassVar[bool] = True  # a trace's output lengths are what its requests produce
    timeout_s: ClassVar[float] = 300.0
    start_timeout_s: ClassVar[float] = 120.0  # for the harness's start signal
    wait_time = constant(0)

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self.loop: OpenLoop[ScheduledRequest, str] | None = None

    def stopping(self) -> bool:
        return bool(self._state == LOCUST_STATE_STOPPING)

    @task
    def replay(self) -> None:
        start = self._await_start()
        if start is None or getattr(self.environment, CLAIM_ATTRIBUTE, False):
            self._idle()  # one replay per process; a second user has nothing to send
        setattr(self.environment, CLAIM_ATTRIBUTE, True)
        schedule = self.schedule
        assert schedule is not None and start is not None, "the harness sets the schedule"
        blocks = BlockText(self.prompts, schedule.block_tokens or BLOCK_TOKENS, self.seed)

        def prepare(item: ScheduledRequest) -> str:
            """The prompt, before its time: its blocks' text, or (a trace without blocks)
            text of its own, which knows its seeds (block_ids.PromptText)."""
            if item.hash_ids:
                return blocks.prompt(item.hash_ids, item.input_tokens)
            return self.user_prompt(item.input_tokens)

        self.loop = OpenLoop(
            start.mine(schedule.requests), start.t0, lambda r: r.at_s, prepare, self._send_one
        )
        try:
            self.loop.run(self.stopping)
            self.loop.drain(self.stopping)
        finally:
            self.loop.stop()
        self._idle()

    def _await_start(self) -> ReplayStart | None:
        signal = replay_start(self.environment)
        deadline = time.monotonic() + self.start_timeout_s
        while not self.stopping() and time.monotonic() < deadline:
            start = signal.wait(timeout=POLL_S)
            if isinstance(start, ReplayStart):
                return start
        return None

    def _idle(self) -> None:
        """Holds the user (Locust would start the task again) until it is stopped."""
        while not self.stopping():
            gevent.sleep(POLL_S)
        raise StopUser()

    def on_stop(self) -> None:
        if self.loop is not None:
            self.loop.stop()
        super().on_stop()

    def _send_one(self, item: ScheduledRequest, due: float, prompt: str) -> None:
        rule = self.rules[item.rule]
        who = Caller(rule.api_key, rule.api_key_name, rule.tenant, rule.priority)
        blocks = " ".join(f"t{h}" for h in item.hash_ids) if item.hash_ids else None
        self.send(
            [{"role": "user", "content": prompt}],
            item.input_tokens,
            caller=who,
            extra_headers={PREFIX_HEADER: str(item.input_tokens)},
            public_prefix=rule.public_prefix,
            max_tokens=item.output_tokens,
            traffic_class=rule.traffic_class,
            blocks=blocks,
            t_scheduled=due,
        )
