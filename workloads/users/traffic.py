"""The traffic classes a shared KV-cache pool sees, one small user class each.

Each class registers itself by its `name` (the plan's name for it) and says in
`traffic_class` what its records carry. Defaults use the demo tenants of
`server/tenants.demo.yaml`; every annotated class attribute is one a plan may override.
Sizes are in tokens of the reference tokenizer.
"""

from __future__ import annotations

import time
import uuid
import zlib
from collections.abc import Callable
from typing import Any, ClassVar

import gevent
from locust import between, constant, task

from contract import Outcome
from workloads.block_ids import literal
from workloads.client import StreamResult
from workloads.users.base import Caller, KvgateUser, TaskOutline

HOLD_POLL_S = 0.01  # how often a probe looks whether the warm request has begun streaming


def wait_for_tick(user: KvgateUser, period_s: float, delay_s: float = 0.0) -> bool:
    """Sleep until `delay_s` past the next multiple of `period_s` on the wall clock, so every
    user aligned alike fires together; False when the user's phase ended meanwhile."""
    gevent.sleep((delay_s - time.time()) % period_s or period_s)
    return user.in_phase()


class ShortQACritical(KvgateUser):
    """Short questions from the system tenant at critical priority (the TTFT gate's class).

    With `align_s`, each question waits for `align_delay_s` past the next tick of that
    period: questions that arrive with a wave of other critical work (see TenantBurst)."""

    name = "short_qa_critical"
    traffic_class = "short_qa"
    api_key, api_key_name, tenant, priority = "kvg-sys-key", "system-demo", "system", "critical"
    weight = 3
    prompt_tokens, max_tokens = 64, 64
    timeout_s = 30.0
    align_s: ClassVar[float | None] = None
    align_delay_s: ClassVar[float] = 0.0

    @classmethod
    def outline(cls) -> TaskOutline:
        return TaskOutline((cls.request_kind(),), align_s=cls.align_s)

    @task
    def ask(self) -> None:
        if self.align_s and not wait_for_tick(self, self.align_s, self.align_delay_s):
            return
        self.send_prompt()


class ShortQAInteractive(ShortQACritical):
    """Short questions from a customer tenant at interactive priority."""

    name = "short_qa_interactive"
    api_key, api_key_name, tenant, priority = "kvg-acme-key", "acme-demo", "acme", "interactive"
    weight = 10


class LongContext(KvgateUser):
    """Long inputs (32K tokens by default) with short answers: prefill-heavy."""

    name = "long_context"
    traffic_class = "long_context"
    api_key, api_key_name, tenant = "kvg-globex-key", "globex-demo", "globex"
    weight = 1
    # 32,000 + 256 stays inside the demo tenants' 32,768-token context limit.
    prompt_tokens, max_tokens = 32_000, 256
    timeout_s = 120.0
    wait_time = between(1.0, 3.0)

    @task
    def read_long(self) -> None:
        self.send_prompt()


class LongOutput(KvgateUser):
    """Short inputs, thousands of output tokens, all of them generated: `ignore_eos`, and
    `min_tokens` at max_tokens for a server that takes min_tokens but not ignore_eos. A plan
    that changes max_tokens moves min_tokens with it, unless it sets min_tokens as well."""

    name = "long_output"
    traffic_class = "long_output"
    api_key, api_key_name, tenant = "kvg-initech-key", "initech-demo", "initech"
    weight = 1
    prompt_tokens, max_tokens = 256, 4096
    min_tokens = max_tokens
    ignore_eos = True
    timeout_s = 300.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "max_tokens" in vars(cls) and "min_tokens" not in vars(cls):
            cls.min_tokens = cls.max_tokens

    @task
    def write_long(self) -> None:
        self.send_prompt()


class SharedPrefix(KvgateUser):
    """Long system prompts shared across requests: public ones by every tenant (sent as
    public prefixes), private ones per tenant. Each user instance takes one tenant of
    `tenant_pool` (round robin), unless the plan gives the class its own `api_key`: then
    every user is that tenant."""

    name = "shared_prefix"
    traffic_class = "shared_prefix"
    weight = 4
    tenant_pool: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("kvg-acme-key", "acme-demo", "acme"),
        ("kvg-globex-key", "globex-demo", "globex"),
        ("kvg-initech-key", "initech-demo", "initech"),
    )
    prefix_tokens: ClassVar[int] = 2048
    public_prefixes: ClassVar[int] = 2
    private_prefixes_per_tenant: ClassVar[int] = 2
    public_share: ClassVar[float] = 0.5
    prompt_tokens, max_tokens = 64, 64  # the question after the system prompt

    def on_start(self) -> None:
        mro = type(self).__mro__
        named = any("api_key" in vars(k) for k in mro[: mro.index(SharedPrefix)])
        if self.tenant_pool and not named:
            key, key_name, tenant = self.tenant_pool[self.index % len(self.tenant_pool)]
            self.api_key, self.api_key_name, self.tenant = key, key_name, tenant

    @task
    def ask_with_system_prompt(self) -> None:
        public = self.rng.random() < self.public_share
        if public:
            owner, count = "public", self.public_prefixes
        else:
            owner, count = f"tenant:{self.tenant}", self.private_prefixes_per_tenant
        which = self.rng.randrange(max(count, 1))
        prefix_seed = zlib.crc32(f"{owner}:{which}:{self.seed}".encode())
        messages = [
            {"role": "system", "content": self.prompts.text(self.prefix_tokens, prefix_seed)},
            {"role": "user", "content": self.user_prompt(self.prompt_tokens)},
        ]
        # The first `prefix_tokens` prompt tokens lie inside the system message for any
        # template that renders it first, so the header is right for other servers too.
        headers = {"X-Kvgate-Prefix-Tokens": str(self.prefix_tokens)}
        self.send(
            messages,
            self.prefix_tokens + self.prompt_tokens,
            extra_headers=headers,
            public_prefix=public,
        )


class MultiTurn(KvgateUser):
    """Chat sessions of `turns` turns; each turn resends the whole conversation so far."""

    name = "multi_turn"
    traffic_class = "multi_turn"
    weight = 2
    turns: ClassVar[int] = 4
    prompt_tokens, max_tokens = 128, 128  # per turn
    wait_time = between(0.5, 2.0)

    def on_start(self) -> None:
        self.history: list[dict[str, str]] = []
        self.history_tokens = 0

    @task
    def next_turn(self) -> None:
        self.history.append({"role": "user", "content": self.user_prompt(self.prompt_tokens)})
        target = self.history_tokens + self.prompt_tokens
        result = self.send(list(self.history), target, keep_text=True)
        turns_done = len(self.history) // 2 + 1
        if result.outcome != Outcome.OK or turns_done >= self.turns:
            self.history, self.history_tokens = [], 0
            return
        reply_tokens = result.completion_tokens or result.chunks
        # The reply counts as the tokens the server generated, whatever its words.
        reply = literal("".join(result.text or ()), reply_tokens)
        self.history.append({"role": "assistant", "content": reply})
        self.history_tokens = target + reply_tokens


class CancelStorm(KvgateUser):
    """Bursts of streams that the client abandons after `cancel_after_tokens` content chunks
    (or `cancel_after_ms`, whichever comes first): the server must release their blocks."""

    name = "cancel_storm"
    traffic_class = "cancel_storm"
    api_key, api_key_name, tenant = "kvg-initech-key", "initech-demo", "initech"
    weight = 1
    burst_size: ClassVar[int] = 16
    prompt_tokens, max_tokens = 512, 1024
    cancel_after_tokens = 4
    cancel_after_ms = None
    wait_time = between(2.0, 5.0)

    @classmethod
    def outline(cls) -> TaskOutline:
        return TaskOutline((cls.request_kind(count=cls.burst_size),))

    @task
    def storm(self) -> None:
        self.burst(self.burst_size, self.send_prompt)


class TenantBurst(KvgateUser):
    """One tenant suddenly opening `burst_size` concurrent requests (tests the tenant cap).

    With `align_s`, each burst waits for the next multiple of `align_s` on the wall clock, so
    every user of every class aligned alike fires together — agents triggered by one event,
    jobs started by the same cron tick."""

    name = "tenant_burst"
    traffic_class = "tenant_burst"
    api_key, api_key_name, tenant = "kvg-globex-key", "globex-demo", "globex"
    weight = 1
    burst_size: ClassVar[int] = 48
    prompt_tokens, max_tokens = 1024, 256
    align_s: ClassVar[float | None] = None
    wait_time = between(5.0, 10.0)

    @classmethod
    def outline(cls) -> TaskOutline:
        return TaskOutline((cls.request_kind(count=cls.burst_size),), align_s=cls.align_s)

    @task
    def flood(self) -> None:
        if self.align_s and not wait_for_tick(self, self.align_s):
            return  # the phase ended while waiting for the tick
        self.burst(self.burst_size, self.send_prompt)


class Batch(KvgateUser):
    """Offline work: low priority, high volume, closed loop; backs off as Retry-After asks.

    A job runner submits `chunk_size` items at once and waits for the chunk to finish, so a
    few users keep many offline requests in flight, as real batch pipelines do."""

    name = "batch"
    traffic_class = "batch"
    api_key, api_key_name, tenant, priority = "kvg-batch-key", "batchco-demo", "batchco", "batch"
    weight = 3
    prompt_tokens, max_tokens = 512, 256
    timeout_s = 120.0
    honour_retry_after = True
    wait_time = constant(0.05)
    chunk_size: ClassVar[int] = 1

    @classmethod
    def outline(cls) -> TaskOutline:
        return TaskOutline((cls.request_kind(count=cls.chunk_size),))

    @task
    def process_item(self) -> None:
        if self.chunk_size > 1:
            self.burst(self.chunk_size, self.send_prompt)
        else:
            self.send_prompt()


class SecurityProbe(KvgateUser):
    """Probes two security rules under load, over the OpenAI wire format and usage alone.

    Escalation: each entry of `escalations` (key, key name, tenant, priority) asks for a
    class its key does not allow, on every channel the target takes (X-Priority, the body's
    `priority`); the server must refuse it (403) or serve it at an allowed priority, never
    at the one asked. Its record carries the priority asked, so no gate counts it as work of
    the class its key does allow.

    Private prefix: `owner` sends a private system prompt that starts with a fresh nonce, so
    nothing else can share it, and warms the cache with it; then `prober`, another tenant,
    sends the identical prompt (the probe) and one of the same shape with another fresh
    nonce (the cold control), in random order. All three are private: each carries its own
    tenant's cache salt where the target takes one. The probe's cached_tokens above the
    control's is a cross-tenant hit; its TTFT against the control's is the timing side
    channel.
    """

    name = "security_probe"
    traffic_class = "security_probe"
    weight = 1
    # The nightly key may only send batch (server/tenants.demo.yaml).
    escalations: ClassVar[tuple[tuple[str, str, str, str], ...]] = (
        ("kvg-nightly-key", "nightly-demo", "nightly", "critical"),
        ("kvg-nightly-key", "nightly-demo", "nightly", "interactive"),
    )
    owner: ClassVar[tuple[str, str, str]] = ("kvg-acme-key", "acme-demo", "acme")
    prober: ClassVar[tuple[str, str, str]] = ("kvg-globex-key", "globex-demo", "globex")
    # Long enough that prefilling it, or not, shows in TTFT; the question after it is short.
    prefix_tokens: ClassVar[int] = 1536
    # Prefix probe groups run at once per task, each on its own connections: more evidence
    # per user where queueing makes every group slow.
    groups_at_once: ClassVar[int] = 1
    prompt_tokens, max_tokens = 32, 8
    wait_time = between(0.2, 0.6)
    # With a number, the owner's warm request asks that many tokens, and the probe and its
    # control go out together once it has streamed its first one, while it runs: its prefix is
    # then held by a live request, so no eviction under load can hide a cross-tenant hit (a
    # server's LRU may free the blocks the moment the warm request ends). None: the warm
    # request finishes first.
    hold_warm_tokens: ClassVar[int | None] = None

    @classmethod
    def outline(cls) -> TaskOutline:
        """The escalations one after another, then `groups_at_once` prefix groups at once:
        each the owner's warm request, then the probe and its control (one after the other,
        or both while a held warm request streams)."""
        escalations = tuple(
            cls.request_kind(tenant=tenant, priority=asked, probe="escalation")
            for _key, _name, tenant, asked in cls.escalations
        )
        held = cls.hold_warm_tokens is not None
        groups, prompt = cls.groups_at_once, cls.prefix_tokens + cls.prompt_tokens
        warm = cls.request_kind(
            groups,
            tenant=cls.owner[2],
            prompt_tokens=prompt,
            max_tokens=cls.hold_warm_tokens if held else cls.max_tokens,
            probe="prefix_warm",
        )
        pair = tuple(
            cls.request_kind(
                groups, in_series, tenant=cls.prober[2], prompt_tokens=prompt, probe=role
            )
            for role, in_series in (("prefix_probe", 0 if held else 1), ("prefix_control", 1))
        )
        return TaskOutline((*escalations, warm, *pair))

    @task
    def probe(self) -> None:
        for key, key_name, tenant, asked in self.escalations:
            self.ask_escalation(Caller(key, key_name, tenant, asked))
        if self.groups_at_once > 1:
            self.burst(self.groups_at_once, self.probe_private_prefix)
        else:
            self.probe_private_prefix()

    def ask_escalation(self, caller: Caller) -> None:
        content = self.user_prompt(self.prompt_tokens)
        # Asked even where the plan turned priority headers off: it is the probe.
        self.send(
            [{"role": "user", "content": content}],
            self.prompt_tokens,
            caller=caller,
            insist_priority=True,
            probe="escalation",
        )

    def probe_private_prefix(self) -> None:
        owner = Caller(*self.owner, self.priority)
        prober = Caller(*self.prober, self.priority)
        group = f"pg-{uuid.uuid4().hex}"
        shared = self.user_prompt(self.prefix_tokens)
        warming: gevent.Greenlet[..., StreamResult] | None = None
        if self.hold_warm_tokens is None:
            warm = self._send_prefixed(owner, shared, "prefix_warm", group)
        else:
            held: list[StreamResult] = []
            warming = gevent.spawn(
                self._send_prefixed,
                owner,
                shared,
                "prefix_warm",
                group,
                max_tokens=self.hold_warm_tokens,
                watch=held.append,
            )
            while not warming.dead and not (held and held[0].chunks):
                gevent.sleep(HOLD_POLL_S)
            warm = held[0] if held and held[0].chunks else warming.get()
        try:
            if warm.outcome != Outcome.OK and not warm.chunks:
                return  # nothing was cached for the probe to find: the group is incomplete
            control = self.user_prompt(self.prefix_tokens)
            pair = [(shared, "prefix_probe"), (control, "prefix_control")]
            self.rng.shuffle(pair)  # neither goes first every time (connection reuse, load drift)
            if warming is not None:  # both while the warm request holds its prefix
                self.burst(2, lambda: self._send_prefixed(prober, *pair.pop(), group))
                return
            for system, role in pair:
                self._send_prefixed(prober, system, role, group)
        finally:
            if warming is not None:
                warming.join()

    def _send_prefixed(
        self,
        caller: Caller,
        system: str,
        role: str,
        group: str,
        max_tokens: int | None = None,
        watch: Callable[[StreamResult], object] | None = None,
    ) -> StreamResult:
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": self.user_prompt(self.prompt_tokens)},
        ]
        # Private: salted with the caller's tenant where the target takes a salt, and never
        # marked public. A server with neither shares it by content.
        headers = {"X-Kvgate-Prefix-Tokens": str(self.prefix_tokens)}
        return self.send(
            messages,
            self.prefix_tokens + self.prompt_tokens,
            extra_headers=headers,
            caller=caller,
            probe=role,
            probe_group=group,
            max_tokens=max_tokens,
            watch=watch,
        )
