"""Gates per target: what each server profile gives decides which gates apply (N/A)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from contract import servers
from gates.evaluator import evaluate_run
from gates.spec import GateSpecError, load_gate_file
from gates.verdict import Status, Verdict
from tests.gates.builder import RunBuilder, gate_file
from tests.gates.conftest import gate

ROOT = Path(__file__).resolve().parents[2]

Judge = Callable[[RunBuilder], Verdict]
EVENT_GATES = {
    "preempted_complete",
    "critical_not_preempted",
    "batch_stops_at_peak",
    "tenant_share_cap",
    "failover_no_double_reservation",
    "priority_escalation",
    "cancel_release_p99",
    "priority_under_pressure",
}


def external(kind: str, n: int = 400, kv_metric: str | None = None) -> RunBuilder:
    """A run against a `kind` server: answered requests, and its KV gauge if it has one."""
    b = RunBuilder()
    b.meta["target"] = {"kind": kind, "model": "tiny", "url": "http://127.0.0.1:9"}
    for i in range(n):
        b.request(f"r{i}", t=20 + i * 0.1, priority="critical", ttft_s=0.2, e2e_s=0.4)
    if kv_metric:
        for t, value in ((2, 0.01), (5, 0.01), (50, 0.7), (110, 0.01), (115, 0.01)):
            b.sample(kv_metric, value, t, target="server")
    return b


def test_every_profile_loads_cites_its_sources_and_provides_known_data() -> None:
    assert set(servers.kinds()) == {"reference", "vllm", "sglang", "tgi", "openai"}
    for profile in servers.profiles().values():
        assert profile.sources and profile.provides <= set(servers.DATA_KINDS)
    assert servers.profile("reference").provides == set(servers.DATA_KINDS)
    assert servers.profile("no-such-server").kind == "openai"


def test_a_vllm_run_is_judged_on_the_gates_that_apply(judge: Judge) -> None:
    verdict = judge(external("vllm", kv_metric="vllm:kv_cache_usage_perc"))
    status = {g.id: g.status for g in verdict.gates}
    assert {g for g, s in status.items() if s == Status.NA} == EVENT_GATES
    assert status["availability"] == status["memory_back_to_idle"] == Status.PASS
    assert status["no_oom"] == Status.PASS and status["ttft_critical_p95"] == Status.PASS
    na = gate(verdict, "tenant_share_cap")
    assert "vLLM has no tenants" in na.message and "contract/profiles/vllm.yaml" in na.message
    assert na.value_text() == "not applicable to this target"
    # the private-prefix gate needs cached tokens, which vLLM gives: missing data, not N/A
    assert status["private_prefix_isolation"] == Status.INVALID
    assert verdict.status == Status.MARGINAL and verdict.score == 1.0


def test_a_vllm_run_with_recorded_events_is_judged_on_the_seed_gates(judge: Judge) -> None:
    """kvgate's scheduler recorder gives a vLLM run per-request events: the release, the
    preemption and the priority gates apply; what vLLM has no notion of stays N/A, with the
    reason, even though the events carry priorities."""
    b = external("vllm", kv_metric="vllm:kv_cache_usage_perc")
    for i in range(5):
        rid = f"r{i}"
        b.event("queued", 20 + i * 0.1, replica="vllm", request_id=rid, priority="critical")
        b.event("admitted", 20 + i * 0.1, replica="vllm", request_id=rid, priority="critical")
        b.event("released", 21 + i * 0.1, replica="vllm", request_id=rid, priority="critical")
    status = {g.id: g.status for g in judge(b).gates}
    na = {g for g, s in status.items() if s == Status.NA}
    assert na == {"tenant_share_cap", "failover_no_double_reservation", "priority_escalation"}
    escalation = gate(judge(b), "priority_escalation")
    assert "vLLM has no API keys" in escalation.message


def test_a_gauge_the_profile_promises_but_the_run_lacks_is_missing_data(judge: Judge) -> None:
    result = gate(judge(external("vllm")), "memory_back_to_idle")
    assert result.status == Status.INVALID and "no data" in result.message


def test_a_generic_server_without_telemetry_still_gets_a_verdict(judge: Judge) -> None:
    b = external("openai")
    clean = judge(b)
    unsure = {g.id for g in clean.gates if g.status not in (Status.PASS, Status.NA)}
    assert unsure == {"low_priority_explicit_errors"}  # the plan sent no batch work to refuse
    assert clean.status == Status.MARGINAL
    for i in range(300):
        b.request(f"x{i}", outcome="error", error_code="connect_error")
    verdict = judge(b)
    assert verdict.status == Status.FAIL and verdict.exit_code == 3
    assert gate(verdict, "availability").status == Status.FAIL
    assert gate(verdict, "memory_back_to_idle").status == Status.NA


def test_data_a_run_shows_makes_a_gate_apply_whatever_the_profile(judge: Judge) -> None:
    b = external("openai")
    b.event("admitted", 21, request_id="r1", priority="critical", tenant="acme", blocks=4)
    verdict = judge(b)
    assert gate(verdict, "preempted_complete").status == Status.INVALID  # applies: no preemption
    assert gate(verdict, "failover_no_double_reservation").status == Status.NA


def test_an_oom_named_in_an_answer_fails_no_oom_on_any_target(judge: Judge) -> None:
    b = external("tgi")
    b.request("oom", outcome="error", http_status=500, error_message="CUDA out of memory.")
    result = gate(judge(b), "no_oom")
    assert result.status == Status.FAIL and "answered: CUDA out of memory" in str(result.evidence)
    assert any("answers alone" in n for n in result.notes)


def test_junit_marks_na_gates_skipped(tmp_path: Path) -> None:
    path = external("tgi").write(tmp_path / "run")
    verdict = evaluate_run(path)
    suite = ET.parse(path / "junit.xml").getroot()
    skipped = [c.get("name") for c in suite.iter("testcase") if c.find("skipped") is not None]
    assert len(skipped) == len(verdict.not_applicable) == int(suite.get("skipped", "0")) > 0


def test_a_gate_needing_an_unknown_kind_of_data_is_refused(tmp_path: Path) -> None:
    path = gate_file(
        tmp_path / "g.yaml",
        '  - {id: g, title: G, metric: ttft, pass: "p(95) < 1s", needs: [telepathy]}',
    )
    with pytest.raises(GateSpecError, match="unknown kind of data telepathy"):
        load_gate_file(path)


def test_a_gate_file_can_extend_the_builtin_gates_and_leave_some_out(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(
        "extends: builtin\n"
        "skip: {low_priority_explicit_errors: this plan sends no batch work}\n"
        "gates:\n"
        '  - {id: ttft_critical_p95, title: T, metric: ttft, key: true, pass: "p(95) <= 2s"}\n'
    )
    gates = {g.id: g for g in load_gate_file(path).gates}
    assert len(gates) == len(load_gate_file().gates)
    assert gates["ttft_critical_p95"].pass_.value == 2.0
    run = external("openai").write(tmp_path / "run")
    verdict = evaluate_run(run, gates_file=path)
    skipped = next(g for g in verdict.gates if g.id == "low_priority_explicit_errors")
    assert skipped.status == Status.NA and "this plan sends no batch work" in skipped.message
    assert verdict.status == Status.PASS
    path.write_text("extends: builtin\nskip: {no_such_gate: why}\n")
    with pytest.raises(GateSpecError, match="skip names no built-in gate: no_such_gate"):
        load_gate_file(path)


def test_a_gate_file_can_extend_another_and_change_one_key(tmp_path: Path) -> None:
    """A soak variant takes the soak's gates and changes one window: the thresholds stay in
    the soak's file. A file extending itself round the chain is refused by name."""
    soak = ROOT / "harness" / "plans" / "soak.gates.yaml"
    variant = tmp_path / "short.gates.yaml"
    variant.write_text(
        f"extends: {soak}\n"
        "skip: {ttft_flat: not judged here}\n"
        "gates:\n  - {id: memory_floor_flat, params: {window_s: 30}}\n"
    )
    base = {g.id: g for g in load_gate_file(soak).gates}
    gates = {g.id: g for g in load_gate_file(variant).gates}
    assert gates.keys() == base.keys()
    floor = gates["memory_floor_flat"]
    assert floor.params == {"window_s": 30} and floor.pass_ == base["memory_floor_flat"].pass_
    assert floor.abort_on_fail == base["memory_floor_flat"].abort_on_fail
    assert gates["ttft_flat"].skip == "not judged here" and gates["no_oom"].abort_on_fail
    loop = tmp_path / "loop.gates.yaml"
    loop.write_text("extends: loop.gates.yaml\n")
    with pytest.raises(GateSpecError, match="which extends it back"):
        load_gate_file(loop)
    variant.write_text(f"extends: {soak}\nskip: {{nope: why}}\n")
    with pytest.raises(GateSpecError, match=r"skip names no gate of .*soak\.gates\.yaml: nope"):
        load_gate_file(variant)


def test_a_server_process_dying_outside_any_fault_fails_no_oom(judge: Judge) -> None:
    b = external("openai")
    b.sample("process_died", 1.0, 40, target="4242", labels="role=server")
    result = gate(judge(b), "no_oom")
    assert result.status == Status.FAIL
    assert "died outside any injected fault" in str(result.evidence)
    killed = external("openai").fault(39.5, target="server", kind="signal", t_end=52.0)
    killed.rows["faults"][-1]["params"] = '{"signal": "KILL"}'
    killed.sample("process_died", 1.0, 40, target="4242", labels="role=server")
    assert gate(judge(killed), "no_oom").status == Status.PASS  # the plan's own kill
