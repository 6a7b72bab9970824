"""`KvgateUser`: the Locust user every traffic class derives from.

A traffic class is a subclass that sets `name` (which registers it, workloads/users/registry.py)
and whose class attributes say what it sends (tenant, key, priority, sizes, timing,
cancellation); the harness overrides any annotated one for a plan with
`type(name, (cls,), overrides)`, and sets `dialect`: how the target takes kvgate's request
extensions. Requests go through the shared streaming client and leave as one record each
through `environment.events.kvgate_record`.
"""

from __future__ import annotations

import gc
import itertools
import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import gevent
from gevent.pool import Group
from locust import User, between
from locust.env import Environment
from locust.exception import LocustError, StopUser
from locust.user.task import LOCUST_STATE_STOPPING

from contract import Outcome
from workloads.block_ids import BLOCK_TOKENS, prompt_blocks
from workloads.client import StreamClient, StreamRequest, StreamResult
from workloads.dialect import Dialect
from workloads.prompts import DEFAULT_TOKENIZER_PATH, PromptGenerator, generator_for
from workloads.records import RequestMeta, emit, install_record_hook
from workloads.users import registry

_instances = itertools.count()
# Young-generation collections every 700 allocations (the default) cost a streaming load
# generator about a tenth of its CPU: every SSE chunk allocates a few dicts and lists.
GC_GEN0_THRESHOLD = 20_000
_gc_tuned = False


def tune_gc() -> None:
    """Once per process: move everything alive at start-up out of the collector's sight
    (`gc.freeze`) and collect the young generation less often. Cycles are still collected."""
    global _gc_tuned
    if _gc_tuned:
        return
    _gc_tuned = True
    gc.collect()
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


# A burst greenlet never outlives its request's own deadline by more than this.
_BURST_JOIN_SLACK_S = 5.0


PHASE_POLL_S = 0.5  # how often an idle user looks at the load shape's phase


@dataclass(frozen=True, slots=True)
class Caller:
    """Whom a request goes out as: the key (sent, never recorded), the key's name and tenant,
    and the priority class the request is recorded under (and asks for, unless told not to)."""

    api_key: str
    api_key_name: str | None
    tenant: str
    priority: str


@dataclass(frozen=True, slots=True)
class RequestKind:
    """Requests of one kind that one task of a class sends, as data: a plan's sample sizes
    are worked out from it before any load (harness/sampleplan/). `count` go out per task,
    `in_series` of them one after another (a task lasts that many of their latencies; the
    others go at the same time); the rest is what their records carry, and what bounds how
    long each one streams."""

    count: int
    in_series: int
    traffic_class: str
    priority: str
    tenant: str
    prompt_tokens: int
    max_tokens: int | None
    cancel_after_tokens: int | None = None
    cancel_after_s: float | None = None
    probe: str | None = None

    @property
    def cancelled(self) -> bool:
        """Whether its client cancels it while it streams (a cancellation the gates count)."""
        return self.cancel_after_tokens is not None or self.cancel_after_s is not None


@dataclass(frozen=True, slots=True)
class TaskOutline:
    """What one task sends; with `align_s`, each task first waits for the next tick of that
    period on the wall clock, so a user starts at most one task per tick."""

    sends: tuple[RequestKind, ...]
    align_s: float | None = None


class KvgateUser(User):
    """Base traffic class: one streaming chat request per task, measured and recorded.

    Invariant: every request `send` starts fires exactly one record, whatever the ending
    (also when Locust kills the user mid-request).
    """

    abstract = True

    # The plan's name for the class. Set in a class's own body, it registers the class (the
    # registry's rules); a class a plan builds from it inherits it, and so says which
    # registered class it was built from.
    name: ClassVar[str | None] = None
    # What its records carry (a value of contract.TRAFFIC_CLASSES); a named class sets it.
    traffic_class: ClassVar[str] = "short_qa"
    # Locust row names: ttft:<label>, e2e:<label>; a named class's is its name unless it
    # sets its own.
    label: ClassVar[str] = "kvgate"
    # Identity: plain attributes, as classes that spread users over tenants set them per user.
    api_key: str = "kvg-acme-key"
    api_key_name: str | None = "acme-demo"  # a name for the key, never the key
    tenant: str = "acme"
    priority: ClassVar[str] = "interactive"
    model: ClassVar[str] = "llama-3-8b"
    endpoint: ClassVar[str] = "/v1/chat/completions"
    prompt_tokens: ClassVar[int] = 64
    max_tokens: ClassVar[int | None] = 64
    # Ask for this many output tokens at least, and to ignore EOS: each goes out only where
    # the target's dialect takes it.
    min_tokens: ClassVar[int | None] = None
    ignore_eos: ClassVar[bool] = False
    timeout_s: ClassVar[float] = 60.0
    connect_timeout_s: ClassVar[float] = 5.0
    head_timeout_s: ClassVar[float | None] = None  # see StreamRequest.head_timeout_s
    first_token_timeout_s: ClassVar[float | None] = None  # see StreamRequest
    cancel_after_tokens: ClassVar[int | None] = None  # content chunks, see StreamRequest
    cancel_after_ms: ClassVar[float | None] = None
    honour_retry_after: ClassVar[bool] = False
    max_retry_sleep_s: ClassVar[float] = 5.0
    send_priority_header: ClassVar[bool] = True  # False: X-Priority only on escalation probes
    dialect: ClassVar[Dialect] = Dialect()  # set by the harness from the plan's target
    debug_timing: ClassVar[bool] = False
    extra_headers: ClassVar[dict[str, str]] = {}
    seed: ClassVar[int] = 0
    tokenizer_path: ClassVar[str | Path | None] = DEFAULT_TOKENIZER_PATH
    gc_tuning: ClassVar[bool] = True  # see `tune_gc()`; False leaves the collector alone
    # Load-shape phases in which this class starts tasks (e.g. ("peak",) for daytime traffic);
    # empty: always. Its users stay up and wait between tasks otherwise, so phase changes
    # start and stop no users (a task under way finishes). Without a shape that records
    # phases (a distributed worker's), a class always sends.
    phases: ClassVar[tuple[str, ...]] = ()
    # Tokens per block of the records' `prompt_blocks`: the harness gives every class of a
    # run one size (a replayed trace's, when its blocks have another).
    block_tokens: ClassVar[int] = BLOCK_TOKENS
    wait_time = between(0.1, 1.0)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in vars(cls):
            registry.register(cls)

    @classmethod
    def outline(cls) -> TaskOutline:
        """What one task sends: one request of the class's own. A class whose tasks send
        more, or other requests, says so by overriding this."""
        return TaskOutline((cls.request_kind(),))

    @classmethod
    def request_kind(cls, count: int = 1, in_series: int = 1, **fields: Any) -> RequestKind:
        """`count` requests as this class sends them; `fields` replace what differs."""
        cancel_ms = cls.cancel_after_ms
        own: dict[str, Any] = {
            "traffic_class": cls.traffic_class,
            "priority": cls.priority,
            "tenant": cls.tenant,
            "prompt_tokens": cls.prompt_tokens,
            "max_tokens": cls.max_tokens,
            "cancel_after_tokens": cls.cancel_after_tokens,
            "cancel_after_s": None if cancel_ms is None else cancel_ms / 1000.0,
        }
        return RequestKind(count, in_series, **(own | fields))

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        base_url = self.host or environment.host
        if not base_url:
            raise LocustError(
                f"{type(self).__name__} has no target: set its `host` (e.g. "
                "http://127.0.0.1:8000) or pass --host"
            )
        install_record_hook(environment)
        if self.phases:
            # Locust reads wait_time per instance, so this user's pacing wraps its class's
            self.wait_time = self._phase_paced(self.wait_time)  # type: ignore[method-assign]
        if self.gc_tuning:
            tune_gc()
        self.client = StreamClient(base_url, continuous_usage=self.dialect.continuous_usage_stats)
        self.prompts: PromptGenerator = generator_for(self.tokenizer_path)
        self.index = next(_instances)
        # Workers of a distributed run count users from 0 each: their Locust index keeps
        # prompts (and so prefix-cache behaviour) distinct across workers, yet reproducible.
        worker = max(getattr(environment.runner, "worker_index", 0), 0)
        stream = worker * 1_000_003 + self.index
        self.rng = random.Random(self.seed * 1_000_003 + stream)
        self._nonces = itertools.count(stream * 1_000_000)

    def on_start(self) -> None:
        self.await_phase()

    def _phase_paced(self, paced: Callable[[], float]) -> Callable[[], float]:
        """`wait_time` that first waits for one of the class's phases (Locust sleeps what it
        returns, and a user waiting there can be stopped at once)."""

        def wait_time() -> float:
            self.await_phase()
            return paced()

        return wait_time

    def on_stop(self) -> None:
        self.client.close()

    # -- building blocks for traffic classes ---------------------------------------------

    def next_nonce(self) -> int:
        return next(self._nonces)

    def user_prompt(self, n_tokens: int) -> str:
        """A prompt of `n_tokens` tokens unique to this request from its first token."""
        return self.prompts.unique_text(n_tokens, self.seed, self.next_nonce())

    def caller(self) -> Caller:
        """This user's own identity: what `send` uses unless told otherwise."""
        return Caller(self.api_key, self.api_key_name, self.tenant, self.priority)

    def asks_priority(self, insist: bool = False) -> tuple[bool, bool]:
        """(header, field): whether a request asks for its priority in X-Priority and in the
        body's `priority`. `insist` asks on every channel the dialect has, even where the plan
        turned priority headers off (an escalation probe)."""
        dialect = self.dialect
        header = dialect.priority_header and (insist or self.send_priority_header)
        return header, dialect.priority_values is not None

    def headers(self, who: Caller, priority_header: bool) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {who.api_key}"}
        if priority_header:
            headers["X-Priority"] = who.priority
        if self.debug_timing:
            headers["X-Kvgate-Debug-Timing"] = "1"
        headers.update(self.extra_headers)
        return headers

    def body(
        self,
        messages: list[dict[str, str]],
        who: Caller,
        *,
        priority_field: bool,
        public_prefix: bool,
        max_tokens: int | None = None,
    ) -> bytes:
        """The JSON body: the OpenAI request, plus the extensions the dialect takes;
        `max_tokens` replaces the class's for this one request."""
        dialect = self.dialect
        stream_options: dict[str, bool] = {"include_usage": True}
        if dialect.continuous_usage_stats:
            stream_options["continuous_usage_stats"] = True
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": stream_options,
        }
        limit = self.max_tokens if max_tokens is None else max_tokens
        if limit is not None:
            payload["max_tokens"] = limit
        if self.min_tokens is not None and dialect.min_tokens:
            payload["min_tokens"] = self.min_tokens
        if self.ignore_eos and dialect.ignore_eos:
            payload["ignore_eos"] = True
        if priority_field and dialect.priority_values is not None:
            payload["priority"] = dialect.priority_values[who.priority]
        # Private prompts are keyed by tenant; only explicitly public prefixes are shared.
        if dialect.cache_salt and not public_prefix:
            payload["cache_salt"] = dialect.salt(who.tenant)
        return json.dumps(payload).encode()

    def build_request(
        self,
        messages: list[dict[str, str]],
        request_id: str,
        who: Caller,
        *,
        extra_headers: dict[str, str] | None = None,
        keep_text: bool = False,
        public_prefix: bool = False,
        insist_priority: bool = False,
        max_tokens: int | None = None,
    ) -> StreamRequest:
        """What `send` puts on the wire for these arguments (see there), without sending it."""
        header, field = self.asks_priority(insist_priority)
        headers = self.headers(who, header)
        if extra_headers:
            headers.update(extra_headers)
        if public_prefix:
            headers["X-Kvgate-Prefix-Public"] = "1"
        headers["X-Request-Id"] = request_id
        cancel_ms = self.cancel_after_ms
        limit = self.max_tokens if max_tokens is None else max_tokens
        return StreamRequest(
            path=self.endpoint,
            body=self.body(
                messages,
                who,
                priority_field=field,
                public_prefix=public_prefix,
                max_tokens=max_tokens,
            ),
            headers=headers,
            timeout_s=self.timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            head_timeout_s=self.head_timeout_s,
            first_token_timeout_s=self.first_token_timeout_s,
            cancel_after_chunks=self.cancel_after_tokens,
            cancel_after_s=cancel_ms / 1000.0 if cancel_ms is not None else None,
            keep_text=keep_text,
            expects_content=limit != 0,
        )

    def send(
        self,
        messages: list[dict[str, str]],
        target_prompt_tokens: int,
        *,
        extra_headers: dict[str, str] | None = None,
        keep_text: bool = False,
        caller: Caller | None = None,
        public_prefix: bool = False,
        insist_priority: bool = False,
        probe: str | None = None,
        probe_group: str | None = None,
        max_tokens: int | None = None,
        watch: Callable[[StreamResult], object] | None = None,
        traffic_class: str | None = None,
        blocks: str | None = None,
        t_scheduled: float | None = None,
    ) -> StreamResult:
        """Sends one streaming chat request and emits its record; never raises for an ending.

        `caller` sends it as another identity than the user's own. `public_prefix`: the
        request starts with a prefix every tenant may share (sent unsalted, marked public);
        any other request is private to its caller's tenant. `insist_priority` asks for the
        caller's priority on every channel the target has (an escalation probe). `probe` and
        `probe_group` tag a security probe's record (contract.PROBE_ROLES). `max_tokens`
        replaces the class's for this request; `watch` is handed the result before the
        request goes out, so another greenlet can follow it as it streams. A replayed
        request records the `traffic_class` its rule gave, its trace's block ids (`blocks`)
        and its planned send time (`t_scheduled`, epoch s)."""
        request_id = f"kvg-{uuid.uuid4().hex}"
        who = caller or self.caller()
        request = self.build_request(
            messages,
            request_id,
            who,
            extra_headers=extra_headers,
            keep_text=keep_text,
            public_prefix=public_prefix,
            insist_priority=insist_priority,
            max_tokens=max_tokens,
        )
        result = StreamResult(request_id=request_id, t_send=0.0)
        if watch is not None:
            watch(result)
        meta = RequestMeta(
            traffic_class=traffic_class or self.traffic_class,
            tenant=who.tenant,
            priority=who.priority,
            api_key_name=who.api_key_name,
            target_prompt_tokens=target_prompt_tokens,
            max_tokens=self.max_tokens if max_tokens is None else max_tokens,
            label=self.label,
            asked_priority=who.priority if any(self.asks_priority(insist_priority)) else None,
            probe=probe,
            probe_group=probe_group,
            t_scheduled=t_scheduled,
            prompt_blocks=blocks
            or prompt_blocks(messages, target_prompt_tokens, self.block_tokens),
        )
        try:
            self.client.stream(request, result)
        finally:
            emit(self.environment, meta, result)
        if self.honour_retry_after and result.outcome == Outcome.REJECTED and result.retry_after_s:
            gevent.sleep(min(result.retry_after_s, self.max_retry_sleep_s))
        return result

    def await_phase(self) -> None:
        """Idle while the load shape is in a phase this class does not send in; stop the user
        (sending nothing) when Locust asks it to stop.

        A finished shape sends nothing more, but the user still waits for Locust to stop it:
        a user that ended its own greenlet while Locust was stopping users left a dead
        greenlet in the runner's group, and Locust logged an ERROR per class for each."""
        if not self.phases:
            return
        shape = self.environment.shape_class
        while hasattr(shape, "phases") and not self._in_phase(shape.phases):
            if self._state == LOCUST_STATE_STOPPING:
                raise StopUser()
            gevent.sleep(PHASE_POLL_S)

    def in_phase(self) -> bool:
        """Whether the load shape is in one of this class's phases now (always, without)."""
        shape = self.environment.shape_class
        return not self.phases or not hasattr(shape, "phases") or self._in_phase(shape.phases)

    def _in_phase(self, phases: list[dict[str, Any]]) -> bool:
        return bool(phases) and phases[-1].get("t1") is None and phases[-1]["name"] in self.phases

    def send_prompt(self) -> StreamResult:
        """One single-message request of `prompt_tokens` tokens."""
        content = self.user_prompt(self.prompt_tokens)
        return self.send([{"role": "user", "content": content}], self.prompt_tokens)

    def burst(self, size: int, request: Callable[[], object]) -> None:
        """Runs `size` requests at once, each on its own connection, and waits for all.

        If the user is stopped meanwhile, the in-flight requests are killed too (each still
        records its ending)."""
        group = Group()
        try:
            for _ in range(size):
                group.spawn(request)
            group.join(timeout=self.timeout_s + self.connect_timeout_s + _BURST_JOIN_SLACK_S)
        finally:
            group.kill(block=True, timeout=_BURST_JOIN_SLACK_S)
