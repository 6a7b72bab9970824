"""Judging a run again reads the server profile its meta.json keeps, not today's file; today's
files only when asked, and every profile that is not the run's own is named in the verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contract import servers
from gates import run_profile
from gates.cli import main
from gates.evaluator import evaluate_run
from gates.rundir import RunDirError, load_run
from gates.verdict import Status
from tests.gates.builder import RunBuilder, gate_file
from tests.gates.conftest import gate

OLD_REASON = "this vLLM release exposed no KV-cache gauge"


def vllm_run(tmp_path: Path, snapshot: dict[str, Any] | None) -> Path:
    """Answered requests and a KV gauge from a vLLM, with `snapshot` as its kept profile."""
    b = RunBuilder()
    b.meta["target"] = {"kind": "vllm", "model": "tiny", "url": "http://127.0.0.1:9"}
    if snapshot is not None:
        b.meta[run_profile.SNAPSHOT_KEY] = snapshot
    for i in range(400):
        b.request(f"r{i}", t=20 + i * 0.1, priority="critical", ttft_s=0.2, e2e_s=0.4)
    for t, value in ((2, 0.01), (5, 0.01), (50, 0.7), (110, 0.01), (115, 0.01)):
        b.sample("vllm:kv_cache_usage_perc", value, t, target="server")
    return b.write(tmp_path / "run")


def old_vllm_profile() -> dict[str, Any]:
    """The vllm profile as a run made under an older one kept it: it lacked the KV gauge
    (and the GPU memory that would stand in for it), which today's file gives."""
    kept = run_profile.snapshot(servers.profile("vllm"))
    assert isinstance(kept["lacks"], dict) and "kv_usage" in kept["provides"]
    kept["lacks"] |= {"kv_usage": OLD_REASON, "gpu_memory": OLD_REASON}
    kept["provides"] = [kind for kind in kept["provides"] if kind != "kv_usage"]
    return kept


def test_judging_again_reads_the_profile_the_run_kept(tmp_path: Path) -> None:
    run = vllm_run(tmp_path, old_vllm_profile())
    kept = evaluate_run(run)
    memory = gate(kept, "memory_back_to_idle")
    assert memory.status == Status.NA and OLD_REASON in memory.message
    assert kept.profile == {"kind": "vllm", "source": "meta.json"}
    assert not any("profile" in note for note in kept.notes)
    # today's vllm.yaml gives the gauge: asked for, the same run is judged by it, and says so
    today = evaluate_run(run, current_profiles=True)
    assert gate(today, "memory_back_to_idle").status == Status.PASS
    assert today.profile == {"kind": "vllm", "source": "contract/profiles/vllm.yaml"}
    assert any(
        "today's contract/profiles/vllm.yaml" in n and "--current-profiles" in n
        for n in today.notes
    )


def test_kvgate_gate_current_profiles_uses_todays_files_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = vllm_run(tmp_path, old_vllm_profile())
    main([str(run)])
    written = json.loads((run / "verdict.json").read_text())
    assert next(g for g in written["gates"] if g["id"] == "memory_back_to_idle")["status"] == "N/A"
    capsys.readouterr()
    main([str(run), "--current-profiles"])
    out = capsys.readouterr().out
    assert "note: judged by today's contract/profiles/vllm.yaml: --current-profiles" in out
    written = json.loads((run / "verdict.json").read_text())
    assert next(g for g in written["gates"] if g["id"] == "memory_back_to_idle")["status"] == "PASS"


def test_a_run_without_a_snapshot_is_judged_by_todays_file_and_says_so(tmp_path: Path) -> None:
    verdict = evaluate_run(vllm_run(tmp_path, None))
    assert gate(verdict, "memory_back_to_idle").status == Status.PASS
    assert verdict.profile["source"] == "contract/profiles/vllm.yaml"
    assert any("keeps no profile snapshot" in n for n in verdict.notes)


def test_an_unknown_profile_is_named_never_silently_openai(tmp_path: Path) -> None:
    b = RunBuilder()
    b.meta["target"] = {"kind": "mystery", "model": "tiny"}
    for i in range(50):
        b.request(f"r{i}", ttft_s=0.2)
    verdict = evaluate_run(b.write(tmp_path / "run"))
    assert verdict.profile == {"kind": "openai", "source": "contract/profiles/openai.yaml"}
    note = next(n for n in verdict.notes if "openai" in n)
    assert "judged by the generic openai profile" in note
    assert "'mystery' has no profile in contract/profiles/" in note
    assert "keeps no profile snapshot" in note


def test_a_snapshot_this_kvgate_cannot_read_is_refused_with_the_way_out(tmp_path: Path) -> None:
    broken = {**run_profile.snapshot(servers.profile("vllm")), "provides": ["teleportation"]}
    run = vllm_run(tmp_path, broken)
    with pytest.raises(RunDirError, match=r"target_profile .*--current-profiles"):
        load_run(run)
    assert load_run(run, current_profiles=True).profile == servers.profile("vllm")


def test_report_current_profiles_judges_again_by_the_gates_the_verdict_keeps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No gate file at hand: the verdict's own gates (as they judged) judge the run again by
    today's profile, for the report only; verdict.json stays as the run was judged."""
    from reports.cli import main as report

    run = vllm_run(tmp_path, old_vllm_profile())
    gates = gate_file(
        tmp_path / "mine.gates.yaml",
        "  - {id: memory_back_to_idle, title: t, metric: memory_return, pass: 'max <= 0.1',\n"
        "     needs: ['gpu_memory|kv_usage']}",
        "  - {id: served, title: t, metric: availability, pass: 'rate >= 0.9'}",
    )
    evaluate_run(run, gates_file=gates)
    gates.unlink()
    kept = (run / "verdict.json").read_text()
    assert report([str(run), "--current-profiles"]) == 0
    assert "judged by today's contract/profiles/vllm.yaml" in capsys.readouterr().out
    judged = json.loads((run / "report.json").read_text())["verdict"]
    assert {g["id"]: g["status"] for g in judged["gates"]} == {
        "memory_back_to_idle": "PASS",
        "served": "PASS",
    }
    assert judged["gates_file"] == str(gates) and judged["fail_score_below"] == 0.75
    assert (run / "verdict.json").read_text() == kept
