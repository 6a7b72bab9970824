"""The security gates and the TTFT side channel over hand-built probe records."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gates import schema
from gates.metrics_security import side_channel
from gates.rundir import load_run
from gates.verdict import Status, Verdict
from tests.gates.builder import PREFIX_TOKENS, RunBuilder, prefix_group
from tests.gates.conftest import gate

Judge = Callable[[RunBuilder], Verdict]


def escalation(
    b: RunBuilder, rid: str, status: int = 403, granted: str | None = None, **fields: Any
) -> RunBuilder:
    """A batch-only key asking for critical; `granted`: the priority its server events show."""
    outcome = "ok" if status == 200 else "rejected"
    b.request(
        rid,
        traffic_class="security_probe",
        tenant="nightly",
        priority="critical",
        asked_priority="critical",
        probe="escalation",
        outcome=outcome,
        http_status=status,
        **fields,
    )
    if granted is not None:
        b.event("admitted", 20.1, request_id=rid, tenant="nightly", priority=granted)
        b.event("finished", 20.5, request_id=rid, tenant="nightly", priority=granted)
    return b


def refused(n: int) -> RunBuilder:
    b = RunBuilder()
    for i in range(n):
        escalation(b, f"e{i}")
    return b


def test_refused_escalations_pass_once_there_are_enough_of_them(judge: Judge) -> None:
    result = gate(judge(refused(30)), "priority_escalation")
    assert (result.status, result.value, result.n_samples) == (Status.PASS, 0, 30)
    assert "30 refused with a 4xx" in result.notes[0]
    thin = gate(judge(refused(29)), "priority_escalation")
    assert thin.status == Status.MARGINAL and "needs >= 30 samples" in thin.message


def test_an_escalation_run_at_the_priority_asked_fails(judge: Judge) -> None:
    b = escalation(refused(40), "honoured", status=200, granted="critical", api_key_name="nd")
    result = gate(judge(b), "priority_escalation")
    assert (result.status, result.value, result.n_samples) == (Status.FAIL, 1, 41)
    (evidence,) = result.evidence
    assert evidence["request_id"] == "honoured" and evidence["tenant"] == "nightly"
    assert (
        "key nd asked critical" in evidence["detail"] and "ran it at critical" in evidence["detail"]
    )


def test_a_server_that_clamps_the_priority_is_fine(judge: Judge) -> None:
    b = RunBuilder()
    for i in range(30):
        escalation(b, f"e{i}", status=200, granted="batch")
    result = gate(judge(b), "priority_escalation")
    assert result.status == Status.PASS and "30 run at a priority the key allows" in result.notes[0]


def test_escalations_no_event_explains_are_not_evidence_either_way(judge: Judge) -> None:
    b = RunBuilder()
    escalation(b, "served", status=200)  # an OpenAI server without events: granted what?
    escalation(b, "shed", status=429)  # let in, then shed for load
    escalation(b, "bad-key", status=401)  # the plan's key is not this server's
    escalation(b, "died", status=500)
    result = gate(judge(b), "priority_escalation")
    assert result.status == Status.INVALID and result.n_samples == 0
    assert result.message.startswith("no data")
    judged = gate(judge(escalation(refused(30), "served", status=200)), "priority_escalation")
    assert judged.status == Status.PASS and judged.n_samples == 30
    assert "not evidence either way (1" in judged.notes[-1] and "status=200" in judged.notes[-1]


def test_events_are_matched_on_tenant_and_request_id(judge: Judge) -> None:
    b = refused(30)
    escalation(b, "mine", status=200)
    # Another tenant's request that happens to share the id ran at critical: not this probe.
    b.event("admitted", 20.1, request_id="mine", tenant="system", priority="critical")
    result = gate(judge(b), "priority_escalation")
    assert result.status == Status.PASS and result.n_samples == 30


def test_no_probe_is_no_data_naming_the_traffic_class(judge: Judge) -> None:
    verdict = judge(RunBuilder().request("a", ttft_s=0.1))
    for gate_id in ("priority_escalation", "private_prefix_isolation"):
        result = gate(verdict, gate_id)
        assert result.status == Status.INVALID and "security_probe" in result.message


def isolated(n: int) -> RunBuilder:
    b = RunBuilder()
    for g in range(n):
        prefix_group(b, g)
    return b


def test_isolated_private_prefixes_pass_once_there_are_enough_groups(judge: Judge) -> None:
    result = gate(judge(isolated(20)), "private_prefix_isolation")
    assert (result.status, result.value, result.n_samples) == (Status.PASS, 0, 20)
    thin = gate(judge(isolated(19)), "private_prefix_isolation")
    assert thin.status == Status.MARGINAL and "needs >= 20 samples" in thin.message


def test_a_probe_that_reuses_another_tenants_private_prefix_fails(judge: Judge) -> None:
    b = prefix_group(isolated(25), 99, cached=(PREFIX_TOKENS, 0))
    result = gate(judge(b), "private_prefix_isolation")
    assert (result.status, result.value, result.n_samples) == (Status.FAIL, 1, 26)
    (evidence,) = result.evidence
    assert evidence["request_id"] == "prefix_probe-99" and evidence["value"] == PREFIX_TOKENS
    assert "globex reused 1536 cached tokens of acme's private prefix" in evidence["detail"]


def test_a_hit_is_relative_to_the_cold_control(judge: Judge) -> None:
    # A server that reports a cached chat-template head for every prompt: no cross-tenant hit.
    b = RunBuilder()
    for g in range(20):
        prefix_group(b, g, cached=(16, 16))
    assert gate(judge(b), "private_prefix_isolation").status == Status.PASS


def test_groups_that_could_not_have_hit_are_left_out_and_said(judge: Judge) -> None:
    b = isolated(20)
    # 50-53 could not show a cross-tenant hit, so not even a "hit" there is counted.
    prefix_group(b, 50, cached=(PREFIX_TOKENS, 0), replicas=("r0", "r1", "r1"))  # elsewhere
    prefix_group(b, 51, cached=(PREFIX_TOKENS, 0), prober="acme")  # the owner's own prefix
    prefix_group(b, 52, warm_outcome="rejected")  # nothing was cached
    prefix_group(b, 53, cached=(None, None))  # usage without cached tokens
    prefix_group(b, 54, cached=(0, 0), replicas=(None, None, None))  # replicas unnamed: counts
    result = gate(judge(b), "private_prefix_isolation")
    assert (result.status, result.n_samples) == (Status.PASS, 21)
    notes = " | ".join(result.notes)
    for said in (
        "1 group(s), the probe ran on another replica",
        "1 group(s), owner and prober are one tenant",
        "1 group(s), not all three requests served",
        "1 group(s) whose usage reports no cached_tokens",
    ):
        assert said in notes


def test_the_side_channel_is_the_paired_median_ttft_difference(tmp_path: Path) -> None:
    b = RunBuilder()
    for g in range(20):
        # The probe is 30 ms faster than its control in every pair, at varying load.
        base = 0.2 + 0.01 * (g % 7)
        prefix_group(b, g, ttft=(base, base + 0.030 + 0.001 * (g % 3)))
    prefix_group(b, 40, ttft=(0.1, 5.0), replicas=("r0", "r0", "r1"))  # control elsewhere: out
    timing = side_channel(load_run(b.write(tmp_path / "run")))
    assert timing is not None and timing.pairs == 20
    assert timing.median_s == pytest.approx(-0.031)
    assert timing.lo_s == pytest.approx(-0.032) and timing.hi_s == pytest.approx(-0.030)
    assert "median -31.0 ms [-32.0, -30.0] (95%), n = 20 pairs: the probe is faster" in (
        timing.sentence()
    )


def test_the_side_channel_shows_in_the_notes_even_without_usage(judge: Judge) -> None:
    b = RunBuilder()
    for g in range(8):
        prefix_group(b, g, cached=(None, None), ttft=(0.30, 0.30 + 0.001 * (g - 4)))
    result = gate(judge(b), "private_prefix_isolation")
    assert result.status == Status.INVALID  # no cached tokens: the gate cannot judge
    assert result.notes[0].startswith("TTFT side channel: probe minus cold control, median")
    assert "n = 8 pairs: no difference shown" in result.notes[0]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_runs_written_before_the_probe_columns_still_read(tmp_path: Path, fmt: str) -> None:
    path = RunBuilder().request("a", ttft_s=0.2).write(tmp_path / "old", fmt)
    table = path / f"{schema.REQUESTS}.{fmt}"
    old_columns = [
        c for c in schema.REQUEST_COLUMNS if c not in ("asked_priority", "probe", "probe_group")
    ]
    if fmt == "jsonl":
        row = {k: v for k, v in json.loads(table.read_text()).items() if k in old_columns}
        table.write_text(json.dumps(row) + "\n")
    else:
        pd.read_parquet(table)[old_columns].to_parquet(table, index=False)
    run = load_run(path)
    assert run.requests[["asked_priority", "probe", "probe_group"]].isna().all().all()
    assert side_channel(run) is None
