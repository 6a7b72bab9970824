"""The client-side gates: availability and timeouts/disconnects, judged from answers alone."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contract
from gates.metrics_client import failed, request_failed
from gates.verdict import Status, Verdict
from tests.gates.builder import RunBuilder
from tests.gates.conftest import gate

Judge = Callable[[RunBuilder], Verdict]


def served(n: int, b: RunBuilder | None = None, klass: str = "short_qa") -> RunBuilder:
    b = b or RunBuilder()
    for i in range(n):
        b.request(f"{klass}{i}", t=20 + i * 0.01, traffic_class=klass, ttft_s=0.1, e2e_s=0.5)
    return b


def test_a_clean_run_is_available_with_enough_evidence(judge: Judge) -> None:
    result = gate(judge(served(400)), "availability")
    assert result.status == Status.PASS and result.n_samples == 400
    thin = gate(judge(served(50)), "availability")
    assert thin.status == Status.INVALID and "needs >=" in thin.message


def test_forty_percent_refused_connections_fail_the_run_and_name_the_errors(judge: Judge) -> None:
    b = served(300)
    for i in range(200):
        b.request(
            f"x{i}", outcome="error", http_status=None, error_code="connect_error",
            error_message="Connection refused",
        )  # fmt: skip
    verdict = judge(b)
    result = gate(verdict, "availability")
    assert result.status == Status.FAIL and result.value == 0.6
    assert verdict.status == Status.FAIL and verdict.exit_code == 3
    assert any("200 of 500 failed" in n and "connect_error" in n for n in result.notes)


def test_wrong_model_400s_are_failures_but_429_and_shed_503_are_refusals(judge: Judge) -> None:
    b = served(400)
    for i in range(100):
        b.request(f"q{i}", outcome="rejected", http_status=429, retry_after_s=1.0)
        b.request(f"s{i}", outcome="rejected", http_status=503, retry_after_s=1.0)
    assert gate(judge(b), "availability").status == Status.PASS
    for i in range(50):
        b.request(f"m{i}", outcome="rejected", http_status=400, error_code="model_not_found")
        b.request(f"u{i}", outcome="rejected", http_status=503)  # no Retry-After: a failure
    result = gate(judge(b), "availability")
    assert result.status == Status.FAIL and result.value == 600 / 700
    assert any("model_not_found" in n for n in result.notes)


def test_a_stream_without_content_is_not_served(judge: Judge) -> None:
    """A 200 that ends cleanly with no content chunk served nothing: a failure, recorded as
    the client's `empty_stream` error or, by an older client, as `ok` with no chunk."""
    b = served(400)
    for i in range(5):
        b.request(f"e{i}", outcome="error", error_code="empty_stream", chunks=0, max_tokens=64)
        b.request(f"o{i}", chunks=0, max_tokens=64)
    b.request("none", chunks=0, max_tokens=0)  # asked for no output: its answer is empty
    result = gate(judge(b), "availability")
    assert result.status == Status.FAIL and result.value == 401 / 411
    [note] = [n for n in result.notes if "10 of 411 failed" in n]
    assert "5 HTTP 200 error empty_stream" in note and "5 HTTP 200 ok empty_stream" in note
    assert {e["request_id"][0] for e in result.evidence} == {"e", "o"}


def test_client_cancels_probes_and_fault_cut_requests_are_left_out(judge: Judge) -> None:
    b = served(400).fault(30.0, target="r0")
    for i in range(30):
        b.request(f"c{i}", outcome="cancelled", cancel_at=21.0)
        b.request(f"p{i}", outcome="rejected", http_status=403, probe="escalation")
        b.request(
            f"k{i}", t=29, outcome="error", error_code="replica_failed", replica="r0", e2e_s=1.5
        )
    result = gate(judge(b), "availability")
    assert result.status == Status.PASS and result.n_samples == 400
    assert any("30 requests cut short" in n for n in result.notes)


def test_timeouts_and_disconnects_have_their_own_rate(judge: Judge) -> None:
    b = served(400)
    assert gate(judge(b), "timeouts_disconnects").status == Status.PASS
    for i in range(10):
        b.request(f"t{i}", outcome="timeout")
        b.request(f"d{i}", outcome="disconnected")
    result = gate(judge(b), "timeouts_disconnects")
    assert result.status == Status.FAIL and result.value == 20 / 420
    assert "10 timeout" in result.notes[0] and "10 disconnected" in result.notes[0]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(contract.OUTCOMES),
            st.one_of(st.none(), st.sampled_from([200, 400, 401, 404, 413, 429, 500, 502, 503])),
            st.one_of(st.none(), st.floats(min_value=0, max_value=60)),
            st.sampled_from([0, 1, 7]),
            st.one_of(st.none(), st.sampled_from([0, 1, 64])),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_the_early_stop_counts_failures_by_the_same_rule_as_the_gate(
    rows: list[tuple[str, int | None, float | None, int, int | None]],
) -> None:
    """The run's early stop sees requests one at a time (`request_failed`); the gate sees the
    table (`failed`). The two must agree on every request, or a run could stop for failures
    the gate does not count, or go on through failures it does."""
    columns = ["outcome", "http_status", "retry_after_s", "chunks", "max_tokens"]
    table = pd.DataFrame(rows, columns=columns)
    # as read from a run: nullable numbers are floats
    table = table.astype({"http_status": float, "retry_after_s": float, "max_tokens": float})
    one_by_one = [request_failed(*row) for row in rows]
    assert failed(table).tolist() == one_by_one
