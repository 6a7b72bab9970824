"""The seed's watermarks belong to a scheduler that keeps them, as its server profile declares
(`watermarks`): the pool chart draws them and a rollback recommends one only then, whatever
the target's kind is called."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract import servers
from contract.seed import SEED
from gates import run_profile, schema
from gates.rundir import load_run
from gates.spec import load_gate_file
from reports import figures
from reports.charts import LineChart
from reports.decide import compare_runs
from reports.outcomes import server_counters
from tests.gates.builder import RunBuilder


def snapshot(of: str, **changes: Any) -> dict[str, Any]:
    """The profile of kind `of` as a run keeps it in meta.json, with `changes` made to it (None:
    the field left out, as a profile kept before it existed)."""
    kept = run_profile.snapshot(servers.profile(of))
    for field, value in changes.items():
        if value is None:
            kept.pop(field, None)
        else:
            kept[field] = value
    return kept


def pool_run(tmp_path: Path, kind: str, kept: dict[str, Any] | None, **config: float) -> Path:
    """A run with a pool-usage gauge, made against `kind`, keeping `kept` as its profile."""
    b = RunBuilder()
    b.meta["target"] = {"kind": kind, "model": "m", "config": config}
    if kept is not None:
        b.meta[run_profile.SNAPSHOT_KEY] = kept
    b.request("r", ttft_s=0.1)
    for t, value in ((5, 0.1), (50, 0.7), (110, 0.1)):
        b.sample("kvgate_pool_usage_ratio", value, t)
    return b.write(tmp_path / kind)


def drawn(path: Path) -> dict[str, float]:
    chart, _ = figures.pool_usage(load_run(path))
    assert isinstance(chart, LineChart)
    return {re.sub(r" [0-9.]+( \(default\))?$", "", r.label): r.at for r in chart.hrules}


def test_a_profile_without_watermarks_draws_none_whatever_its_kind_is_called(
    tmp_path: Path,
) -> None:
    kept = snapshot("reference", watermarks=[])
    assert drawn(pool_run(tmp_path, "reference", kept, admission_watermark=0.8)) == {}


def test_a_profile_that_declares_the_seeds_watermarks_gets_them_drawn(tmp_path: Path) -> None:
    """A kind of server kvgate has never heard of, whose scheduler keeps the seed's ladder:
    the configured admission watermark, and the seed's where the run recorded none."""
    kept = snapshot("reference", kind="ownstack", watermarks=["admission_watermark"])
    lines = drawn(pool_run(tmp_path, "ownstack", kept, admission_watermark=0.7))
    assert lines == {"admission watermark": 0.7}
    kept = snapshot("reference", kind="ownstack", watermarks=list(SEED.watermarks()))
    lines = drawn(pool_run(tmp_path / "all", "ownstack", kept))
    assert lines == {name.replace("_", " "): v for name, v in SEED.watermarks().items()}


def test_a_reference_run_kept_before_profiles_declared_watermarks_still_draws_the_seeds(
    tmp_path: Path,
) -> None:
    old = snapshot("reference", watermarks=None)  # the key did not exist then
    assert "watermarks" not in old
    lines = drawn(pool_run(tmp_path, "reference", old, hard_watermark=0.9))
    assert lines == {
        "admission watermark": SEED.admission_watermark,
        "batch prefill pause watermark": SEED.batch_prefill_pause_watermark,
        "hard watermark": 0.9,
    }
    old_vllm = snapshot("vllm", watermarks=None)
    assert drawn(pool_run(tmp_path / "v", "vllm", old_vllm)) == {}


def test_a_rollback_recommends_no_watermark_to_a_scheduler_that_keeps_none(
    run_copy: Callable[[str], Path],
) -> None:
    candidate, baseline = run_copy("oom"), run_copy("clean")
    gates = load_gate_file()
    kept = compare_runs(load_run(candidate), load_run(baseline), gates)
    assert kept.decision == "ROLLBACK" and kept.recommended_admission_watermark is not None
    meta_path = candidate / schema.META_FILE
    meta = json.loads(meta_path.read_text())
    meta[run_profile.SNAPSHOT_KEY]["watermarks"] = []
    meta_path.write_text(json.dumps(meta))
    without = compare_runs(load_run(candidate), load_run(baseline), gates)
    assert without.decision == "ROLLBACK"
    assert without.recommended_admission_watermark is None and without.watermark_reason == ""


def test_the_server_counters_show_where_the_profile_gives_no_events(tmp_path: Path) -> None:
    """Counters stand in for per-request events; a server that gives events (as its
    profile says, whatever its kind is called) gets none."""
    b = RunBuilder()
    b.meta["target"] = {"kind": "ownstack", "model": "m"}
    b.request("r", ttft_s=0.1)
    for t, value in ((1, 3.0), (110, 15.0)):
        b.sample("vllm:num_preemptions_total", value, t, target="target")
    b.meta[run_profile.SNAPSHOT_KEY] = snapshot("vllm", kind="ownstack", watermarks=None)
    assert server_counters(load_run(b.write(tmp_path / "counters")))
    b.meta[run_profile.SNAPSHOT_KEY] = snapshot(
        "vllm",
        kind="ownstack",
        watermarks=None,
        provides=["server_events", "kv_usage", "preemption_count"],
    )
    assert server_counters(load_run(b.write(tmp_path / "events"))) == []
