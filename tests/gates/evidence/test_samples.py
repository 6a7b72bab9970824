"""Samples as the gates read them: a null reading loses nothing, a share is 0..1, and a
gauge in percent is refused unless its profile declares the scale."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from contract import servers
from gates import run_profile
from gates.cli import main
from gates.evidence import check_evidence
from gates.rundir import load_run
from gates.verdict import Status, Verdict
from tests.gates.builder import RunBuilder
from tests.gates.conftest import gate
from tests.gates.evidence.conftest import findings

Judge = Callable[[RunBuilder], Verdict]
KV_GAUGE = "vllm:kv_cache_usage_perc"


def test_a_null_reading_between_two_counter_readings_still_shows_the_oom(judge: Judge) -> None:
    b = RunBuilder()
    for t, value in ((20, 0.0), (30, None), (40, 1.0), (50, 1.0)):
        b.sample("kvgate_oom_total", value, t)  # type: ignore[arg-type]
    verdict = judge(b)
    result = gate(verdict, "no_oom")
    assert result.status == Status.FAIL and result.value == 1
    assert any("1 kvgate_oom_total readings were null" in n for n in result.notes)
    (note,) = findings(verdict, "sample_nulls")
    assert note["effect"] == "note" and note["rows"] == [1]
    assert "kvgate_oom_total 1" in str(note["message"])


def test_a_null_tenant_share_leaves_a_clear_breach_a_breach(judge: Judge) -> None:
    b = RunBuilder()
    for t in range(10, 100, 2):
        b.sample("kvgate_tenant_pool_share", 0.20, t, labels="tenant=globex")
    b.sample("kvgate_tenant_pool_share", None, 51, labels="tenant=globex")  # type: ignore[arg-type]
    result = gate(judge(b), "tenant_share_cap")
    assert result.status == Status.FAIL and result.value == pytest.approx(0.20)
    assert any("1 null kvgate_tenant_pool_share" in n for n in result.notes)


def percent_gauge_run(b: RunBuilder) -> RunBuilder:
    b.meta["target"]["kind"] = "vllm"
    for i, value in enumerate((3.0, 40.0, 85.0, 12.0)):
        b.sample(KV_GAUGE, value, 20 + i * 20)
    return b


def test_a_kv_gauge_in_percent_is_refused_naming_its_rows_and_where_its_scale_is_declared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = percent_gauge_run(RunBuilder())
    b.sample(KV_GAUGE, 0.5, 95)
    path = b.write(tmp_path / "run")
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "share_range" in err and "samples.value, rows 0, 1, 2, 3" in err
    assert f"{KV_GAUGE} reads 3 at row 0 (4 of its 5 readings" in err
    assert "look like percent" in err and "contract/profiles/vllm.yaml" in err
    assert "kv_usage_scale: 0.01" in err


def test_a_tenant_share_beyond_one_is_refused_as_the_writers_to_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = RunBuilder().sample("kvgate_tenant_pool_share", 16.0, 30, labels="tenant=globex")
    assert main([str(b.write(tmp_path / "run"))]) == 2
    err = capsys.readouterr().err
    assert "kvgate_tenant_pool_share reads 16 at row 0" in err
    assert "fix what wrote the run to record a share" in err


def test_a_profile_that_declares_its_gauge_in_percent_has_it_read_as_a_share(
    tmp_path: Path,
) -> None:
    vllm = servers.profile("vllm")
    percent = vllm.model_copy(
        update={"metrics": vllm.metrics.model_copy(update={"kv_usage_scale": 0.01})}
    )
    b = percent_gauge_run(RunBuilder())
    b.meta["target_profile"] = run_profile.snapshot(percent)
    run = load_run(b.write(tmp_path / "run"))
    (note,) = [f for f in check_evidence(run).findings if f.check != "host_contention"]
    assert note.check == "share_scale" and note.n_rows == 4
    assert "multiplied by 0.01" in note.message
    gauge = run.samples.loc[run.samples["metric"].eq(KV_GAUGE), "value"]
    assert gauge.tolist() == pytest.approx([0.03, 0.40, 0.85, 0.12])


def test_a_profile_scale_is_what_one_unit_of_the_gauge_is_as_a_share() -> None:
    assert servers.MetricNames(kv_usage=("x",), kv_usage_scale=0.01).kv_usage_scale == 0.01
    with pytest.raises(ValueError, match="kv_usage_scale"):
        servers.MetricNames(kv_usage=("x",), kv_usage_scale=100.0)
