"""A plan's `traffic.trace` (harness/plan_trace.py): checked when the plan loads, with
errors that name the YAML path and what to do; a replay's load lasts its span and drain."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.trace import TraceRequest, write_mooncake
from harness.plan import PlanError, load_plan
from harness.traffic import build_user_classes, run_block_tokens

pytestmark = pytest.mark.timeout(60)


def write_trace(path: Path, seconds: int = 10) -> Path:
    with path.open("w") as out:
        write_mooncake(
            (TraceRequest(float(s), 600 + s, 8, (0, s + 1)) for s in range(seconds)), out
        )
    return path


def plan_file(tmp_path: Path, trace: str, extra: str = "") -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(f"name: p\ntraffic:\n  trace:\n    path: {trace}\n{extra}")
    return path


def test_a_replay_lasts_its_span_plus_its_drain(tmp_path: Path) -> None:
    write_trace(tmp_path / "t.jsonl")
    plan = load_plan(plan_file(tmp_path, "t.jsonl", "    time_scale: 0.5\n    drain_s: 4\n"))
    assert plan.load.duration_s == pytest.approx(9 * 0.5 + 4)


def test_a_missing_trace_names_its_path_and_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as caught:
        load_plan(plan_file(tmp_path, "nowhere.jsonl"))
    assert f"{tmp_path / 'nowhere.jsonl'} is not a file (paths are relative to the plan)" in str(
        caught.value
    )
    assert "point it at a Mooncake .jsonl or an Azure .csv trace" in str(caught.value)


def test_unknown_formats_keys_and_tenants_are_refused_at_their_path(tmp_path: Path) -> None:
    write_trace(tmp_path / "t.jsonl")
    with pytest.raises(PlanError, match=r"traffic.trace.format: unknown trace format 'sharegpt'"):
        load_plan(plan_file(tmp_path, "t.jsonl", "    format: sharegpt\n"))
    with pytest.raises(PlanError, match=r"traffic.trace.rules.0.speed: unknown key"):
        load_plan(plan_file(tmp_path, "t.jsonl", "    rules: [{speed: 2}]\n"))
    with pytest.raises(PlanError, match=r"rules.0: no traffic class sends as tenant 'hooli'"):
        load_plan(plan_file(tmp_path, "t.jsonl", "    rules: [{tenant: hooli}]\n"))


def test_a_load_too_short_for_the_replay_is_refused(tmp_path: Path) -> None:
    write_trace(tmp_path / "t.jsonl")
    extra = "load: {duration_s: 5}\n"
    with pytest.raises(PlanError, match=r"the replay sends for 9 s, longer than load.duration_s"):
        load_plan(plan_file(tmp_path, "t.jsonl", extra))


def test_every_class_of_a_replay_cuts_its_blocks_at_the_traces_size(tmp_path: Path) -> None:
    write_trace(tmp_path / "t.jsonl")
    extra = "    token_scale: 0.25\n  classes: {short_qa_critical: {weight: 1}}\n"
    plan = load_plan(plan_file(tmp_path, "t.jsonl", extra))
    assert run_block_tokens(plan) == 128
    classes = {cls.__name__: cls for cls in build_user_classes(plan, "http://127.0.0.1:1")}
    assert set(classes) == {"short_qa_critical", "trace_replay"}
    assert classes["short_qa_critical"].block_tokens == 128  # type: ignore[attr-defined]
    replay = classes["trace_replay"]
    assert len(replay.schedule.requests) == 10  # type: ignore[attr-defined]
    assert replay.rules[0].api_key == "kvg-acme-key"  # type: ignore[attr-defined]


def test_the_sample_plan_counts_a_replays_requests_from_the_trace(tmp_path: Path) -> None:
    from harness.sampleplan.traffic import model

    write_trace(tmp_path / "t.jsonl", seconds=30)
    extra = (
        "    rules:\n"
        "      - {traffic_class: short_qa, tenant: system, priority: critical,"
        " api_key: kvg-sys-key, max_input_tokens: 614}\n"
        "      - {tenant: acme}\n"
    )
    plan = load_plan(plan_file(tmp_path, "t.jsonl", extra))
    traffic = model(plan)
    everything = traffic.requests(lambda kind: True, [(0.0, traffic.end_s + 60)])
    critical = traffic.requests(lambda kind: kind.priority == "critical", [(0.0, 1e6)])
    assert (everything, critical) == (30, 15)  # inputs 600 + 0..29 tokens: 15 up to 614
    assert traffic.tenants() == {"system", "acme"}


def test_an_azure_trace_replays_its_lengths_without_blocks(tmp_path: Path) -> None:
    (tmp_path / "azure.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    plan = load_plan(plan_file(tmp_path, "azure.csv", "    token_scale: 0.5\n"))
    [replay] = [
        c for c in build_user_classes(plan, "http://127.0.0.1:1") if c.__name__ == "trace_replay"
    ]
    requests = replay.schedule.requests  # type: ignore[attr-defined]
    assert [(r.at_s, r.input_tokens, r.output_tokens, r.hash_ids) for r in requests] == [
        (0.0, 187, 22, ()),
        (pytest.approx(4.314579), 198, 54, ()),
    ]
    assert run_block_tokens(plan) == 512  # no blocks of its own: kvgate's size


def test_the_shares_go_to_the_workers_that_got_a_replay_user() -> None:
    from types import SimpleNamespace

    from harness.replay import CLASS_NAME, replaying_workers

    placed = {"w2": {CLASS_NAME: 1}, "w1": {CLASS_NAME: 1, "batch": 3}, "w3": {"batch": 2}}
    runner = SimpleNamespace(_users_dispatcher=SimpleNamespace(_users_on_workers=placed))
    assert replaying_workers(runner) == ["w1", "w2"]  # type: ignore[arg-type]


def test_kvgate_run_says_how_the_replay_went_in_one_line(tmp_path: Path) -> None:
    import json

    from harness.run_cmd import replay_line

    (tmp_path / "meta.json").write_text(json.dumps({"status": "completed"}))
    assert replay_line(tmp_path) is None  # no trace, no line
    replay = {
        "scheduled": 12031,
        "sent": 12031,
        "unsent": 0,
        "stragglers": 0,
        "clipped": 254,
        "skipped": 0,
        "schedule_error_ms": {"p50": 3.15, "p99": 16.54, "max": 49.7},
        "schedule_error_bound_ms": 25.0,
        "prefix_reuse_server": 0.1602,
        "prefix_reuse_trace": 0.3777,
    }
    (tmp_path / "meta.json").write_text(json.dumps({"replay": replay}))
    assert replay_line(tmp_path) == (
        "replay: 12031 of 12031 requests sent (0 unsent, 0 still running at the end), 254 "
        "clipped, 0 skipped; schedule error p50 3.1 ms, p99 16.5 ms, max 50 ms (bound 25 ms "
        "at p99); prefix reuse server/trace 16.0% / 37.8%"
    )
