"""Shared builders for the scheduler tests: configs, tenants, a fake clock, and a driver that
runs schedule/commit steps and checks every invariant after each one."""

from __future__ import annotations

from collections.abc import Iterable

from server.scheduler import (
    PrefixSpec,
    Priority,
    Scheduler,
    SchedulerConfig,
    SeqRequest,
    StepPlan,
    TenantQuota,
)

ALL = {Priority.CRITICAL: 10**9, Priority.INTERACTIVE: 10**9, Priority.BATCH: 10**9}


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def small_config(**overrides: object) -> SchedulerConfig:
    """A small pool (~1 GiB -> 443 blocks of 16 tokens at llama-3-8b x 1.155) so tests fill it."""
    values: dict[str, object] = {
        "kv_pool_gib": 1.0,
        "step_token_budget": 64,
        "long_request_tokens": 1024,
        "tenant_max_share": 1.0,
        "max_queued": 16,
        # Tests pack the pool to the hard watermark exactly; the critical reserve has its own.
        "critical_reserve": 0.0,
    }
    values.update(overrides)
    return SchedulerConfig(**values)


def quota(name: str, **overrides: object) -> TenantQuota:
    values: dict[str, object] = {
        "name": name,
        "hard_reserved_tokens": 10**9,
        "soft_reserved_tokens": 10**9,
        "max_active_seqs": 10**6,
        "max_context_tokens": 131072,
        "max_gpu_seconds": 1e12,
        "budgets": dict(ALL),
    }
    values.update(overrides)
    return TenantQuota(**values)


def tenants(*names: str, **overrides: object) -> dict[str, TenantQuota]:
    return {n: quota(n, **overrides) for n in names}


def req(
    rid: str,
    tenant: str = "a",
    priority: Priority = Priority.INTERACTIVE,
    prompt: int | tuple[int, ...] = 32,
    max_new: int | None = 8,
    prefix: PrefixSpec | None = None,
    replayable: bool = False,
    deadline_ms: int | None = None,
) -> SeqRequest:
    tokens = tuple(range(1, prompt + 1)) if isinstance(prompt, int) else prompt
    return SeqRequest(rid, tenant, priority, tokens, max_new, prefix, replayable, deadline_ms)


def check_invariants(s: Scheduler) -> None:
    """Everything a broken scheduler would violate, checked against a full recount: the KV
    manager's pool, ledger and block tables, the decode set, and what the scheduler adds."""
    s.check()
    assert s.kv.used_blocks <= s.pool_blocks
    running = list(s.running())
    assert all(q.holds_blocks for q in running)
    assert {q.request_id for q in running} <= {q.request_id for q in s.kv.holders()}
    if s.policy.reserve_full:
        assert s.committed_blocks <= s.pool_blocks


def step(
    s: Scheduler, clock: FakeClock, finished: Iterable[str] = (), dt: float = 0.01
) -> StepPlan:
    plan = s.schedule()
    clock.advance(dt)
    s.commit(plan, finished)
    check_invariants(s)
    return plan


def run_until_idle(s: Scheduler, clock: FakeClock, max_steps: int = 2000) -> int:
    for n in range(max_steps):
        if not s.running_count and not len(s.queue):
            return n
        step(s, clock)
    raise AssertionError(f"scheduler not idle after {max_steps} steps")
