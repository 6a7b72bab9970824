"""Prefill order within a priority class: the seed policy prefills short prompts ahead of
long ones that started before them (a CI run saw short interactive prompts wait ~25 s behind
eight 32K prompts), while the oldest prefill keeps a floor share so none starves; the
baselines keep arrival order."""

from __future__ import annotations

from server.scheduler import Priority, Scheduler, StepPlan
from server.scheduler.step import HEAD_SHARE
from tests.server.scheduler.helpers import FakeClock, req, small_config, step, tenants

BUDGET = 64


def make(policy: str = "seed") -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    cfg = small_config(kv_pool_gib=4.0, step_token_budget=BUDGET, long_request_tokens=4096)
    return Scheduler(cfg, tenants("a", "b", "c", "d"), policy=policy, clock=clock), clock


def chunks(plan: StepPlan) -> dict[str, int]:
    return {c.request_id: c.tokens for c in plan.prefill}


def test_short_prompt_is_prefilled_at_once_behind_long_ones_of_its_class() -> None:
    s, clock = make()
    for t in ("a", "b", "c"):
        s.submit(req(f"long-{t}", t, Priority.INTERACTIVE, prompt=600, max_new=8))
    step(s, clock)
    s.submit(req("short", "d", Priority.INTERACTIVE, prompt=20, max_new=8))
    got = chunks(step(s, clock))
    assert got["short"] == 20, got  # whole prompt in the first step after it started
    assert s.generated_tokens("short") == 1  # its first token came with that chunk
    assert got["long-a"] == BUDGET - 20  # the oldest takes the rest, the others wait
    assert sum(got.values()) == BUDGET


def test_oldest_prefill_keeps_its_floor_under_a_flood_of_short_prompts() -> None:
    s, clock = make()
    s.submit(req("long", "a", Priority.INTERACTIVE, prompt=600, max_new=8))
    for i in range(400):
        if not s.prefilling[Priority.INTERACTIVE].get("long"):
            break
        # Short prompts worth more than the whole budget arrive every step.
        for j in range(4):
            s.submit(req(f"s{i}-{j}", "bcd"[j % 3], Priority.INTERACTIVE, prompt=20, max_new=1))
        got = chunks(step(s, clock))
        assert (
            got.get("long", 0) >= BUDGET // HEAD_SHARE
            or "long" not in s.prefilling[Priority.INTERACTIVE]
        ), got
    else:
        raise AssertionError("the long prefill starved behind short prompts")
    assert i <= 600 // (BUDGET // HEAD_SHARE) + 1


def test_baseline_policies_keep_arrival_order() -> None:
    s, clock = make("vllm")
    for t in ("a", "b", "c"):
        s.submit(req(f"long-{t}", t, Priority.INTERACTIVE, prompt=600, max_new=8))
    step(s, clock)
    s.submit(req("short", "d", Priority.INTERACTIVE, prompt=20, max_new=8))
    assert chunks(step(s, clock)) == {"long-a": BUDGET}
