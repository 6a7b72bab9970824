"""Stats exported to /metrics, and the benchmark's output contract (not its speed)."""

from __future__ import annotations

import json

import pytest

from server.scheduler import Priority, Scheduler, bench
from tests.server.scheduler.helpers import FakeClock, req, small_config, step, tenants


def test_stats_reflect_the_live_state() -> None:
    clock = FakeClock()
    s = Scheduler(small_config(), tenants("a", "b"), clock=clock)
    for i in range(4):
        s.submit(req(f"f{i}", "b", prompt=1000, max_new=600))
    s.submit(req("q", "a", Priority.BATCH, prompt=1000, max_new=600))
    step(s, clock)
    st = s.stats()
    assert st.pool_total_blocks == 443
    assert st.pool_used_blocks == s.kv.pool.used > 0
    assert st.pool_reserved_blocks == 400  # 4 x blocks for 1600 tokens
    assert st.running_by_priority[Priority.INTERACTIVE] == 4
    assert st.waiting_by_priority[Priority.BATCH] == 1
    assert st.estimated_wait_s_by_priority[Priority.BATCH] > 0
    assert st.estimated_wait_s_by_priority[Priority.CRITICAL] == 0
    assert st.tenant_reserved_tokens == {"b": 6400, "a": 0}
    assert st.tenant_pool_share["b"] == pytest.approx(400 / 443)
    assert st.tenant_active_seqs == {"b": 4, "a": 0}
    assert st.tenant_longest_context["b"] == 1600
    assert 0.0 <= st.fragmentation < 1.0


def test_bench_prints_one_json_object_with_the_agreed_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "admission_us_p50",
        "admission_us_p99",
        "step_us_256",
        "step_us_1024",
        "step_us_4096",
        "victim_us_1024",
        "victim_us_4096",
    ):
        assert isinstance(out[key], float) and out[key] > 0, key
    assert out["step_ratio_4096_1024"] == pytest.approx(
        out["step_us_4096"] / out["step_us_1024"], rel=0.01
    )
