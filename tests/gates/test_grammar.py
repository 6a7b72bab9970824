"""The gate file's grammar: thresholds in their metric's unit, a warn no looser than pass, and
the reason a gate blocks a release, with the gates a verdict keeps read back as they judged."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from gates import schema
from gates.cli import format_verdict
from gates.evaluator import evaluate, evaluate_run
from gates.registry import Cause, metric
from gates.rundir import load_run
from gates.spec import BUILTIN_GATES, GateSpec, GateSpecError, checked_gate_file, load_gate_file
from gates.verdict import Status, Verdict
from tests.gates.builder import RunBuilder, gate_file
from tests.gates.conftest import gate
from tests.reports.verdicts import ttft_gate, verdict

ROOT = Path(__file__).resolve().parents[2]


def _plan_gate_files() -> list[Path]:
    """The gate file each shipped plan names (`gates:`), wherever it lives."""
    named = []
    for plan in ROOT.glob("harness/plans/*.yaml"):
        data = yaml.safe_load(plan.read_text()) or {}
        if isinstance(data.get("gates"), str):
            named.append((plan.parent / data["gates"]).resolve())
    return named


SHIPPED = sorted(
    {
        *ROOT.glob("gates/*.yaml"),
        *ROOT.glob("harness/plans/*.gates.yaml"),
        *ROOT.glob("tests/**/*.gates.yaml"),
        *_plan_gate_files(),
    }
)
NO_OOM_REASON = (
    "the release criteria allow no OOM at all: one kills every request on its replica, the "
    "short ones beside the long, and restarts the process"
)


def refusal(tmp_path: Path, *entries: str) -> str:
    """The loader's message for a gate file made of `entries`."""
    with pytest.raises(GateSpecError) as err:
        load_gate_file(gate_file(tmp_path / "g.yaml", *entries))
    return str(err.value)


def paths(message: str) -> list[str]:
    """The YAML paths a loader's message lists, one problem a line after its heading."""
    where = re.compile(r"\s*(gates\[\d+\](?: \(id: \w+\))?(?:\.\w+)*): ")
    return [m.group(1) for line in message.splitlines()[1:] if (m := where.match(line))]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_gate_file_loads_and_its_blocking_gates_say_why(path: Path) -> None:
    gates = load_gate_file(path).gates
    blocking = [g for g in gates if g.blocking]
    assert blocking, f"{path} has no gate that blocks a release"
    assert all(g.blocks_because for g in blocking), [g.id for g in blocking]
    assert all(g.blocking for g in gates if g.key)


@pytest.mark.parametrize(
    ("metric_name", "line", "words"),
    [
        ("ttft", "p(95) <= 90%", "ttft is in seconds, not a share: write ms or s"),
        (
            "ttft",
            "p(95) <= 900",
            "a bare number is ambiguous (k6 reads it as milliseconds): write its unit, "
            "`p(95) <= 900ms` or `p(95) <= 900s`",
        ),
        ("ttft_p95_trend", "slope <= 0.1", "`slope <= 0.1ms` or `slope <= 0.1s`"),
        (
            "availability",
            "rate >= 990ms",
            "a rate is a share between 0 and 1: write `rate >= 0.99` or `rate >= 99%`",
        ),
        (
            "availability",
            "rate >= 99",
            "a rate is a share between 0 and 1: write `rate >= 0.99` or `rate >= 99%`",
        ),
        ("availability", "rate >= 150%", "a rate is a share between 0 and 1"),
        ("availability", "rate >= -0.5", "write `rate >= 0.5` or `rate >= 50%`"),
        (
            "tenant_pool_share",
            "max <= 15",
            "tenant_pool_share is in fraction, a share where 1 is the whole: write "
            "`max <= 0.15` or `max <= 15%`",
        ),
        ("memory_floor", "slope <= 2s", "memory_floor is in share of capacity"),
        ("oom_events", "count == 0s", "how many observations oom_events has) is a plain number"),
        ("oom_events", "count >= -1", "is never below 0: write a number >= 0"),
        ("ttft", "count >= 30ms", "count (how many observations ttft has) is a plain number"),
        ("availability", "sum <= 5%", "sum of availability (how many of its observations are 1)"),
        ("capacity_at_slo", "min >= 40ms", "capacity_at_slo (users) is a plain number"),
    ],
)
def test_a_threshold_not_written_in_its_metrics_unit_is_refused_with_what_fits(
    tmp_path: Path, metric_name: str, line: str, words: str
) -> None:
    message = refusal(tmp_path, f'  - {{id: g, title: G, metric: {metric_name}, pass: "{line}"}}')
    assert "gates[0] (id: g).pass: " in message
    assert words in message


@pytest.mark.parametrize(
    ("metric_name", "fits", "misfits"),
    [
        ("ttft", "p(95) <= 0.9s", "p(95) <= 0.9"),
        ("availability", "rate >= 99%", "rate >= 99"),
        ("memory_return", "min >= -0.05", "min >= -5"),  # a difference of shares
        ("memory_floor", "slope <= -2%", "slope <= -2ms"),  # a slope may be of any sign
        ("server_rss", "slope <= -500", "slope <= -500s"),
        ("rejection_rate_trend", "slope <= 3", "slope <= 3s"),  # a change per hour
    ],
)
def test_each_scale_takes_its_own_forms(
    tmp_path: Path, metric_name: str, fits: str, misfits: str
) -> None:
    entry = "  - {{id: g, title: G, metric: {}, pass: {!r}}}"
    loaded = load_gate_file(gate_file(tmp_path / "ok.yaml", entry.format(metric_name, fits)))
    assert loaded.gates[0].pass_.text == fits
    assert "gates[0] (id: g).pass" in refusal(tmp_path, entry.format(metric_name, misfits))


def test_every_misfit_of_a_file_is_listed_pass_and_warn_alike(tmp_path: Path) -> None:
    message = refusal(
        tmp_path,
        '  - {id: a, title: A, metric: ttft, pass: "p(95) <= 900ms", warn: "p(95) <= 0.8"}',
        '  - {id: b, title: B, metric: availability, pass: "rate >= 99"}',
    )
    assert paths(message) == [
        "gates[0] (id: a).warn",
        "gates[1] (id: b).pass",
    ]


def test_a_metric_declares_a_known_unit_and_a_rate_is_a_share() -> None:
    with pytest.raises(ValueError, match=r"unit .percent. is not one of .*UNIT_SCALES"):
        metric("odd", filters=(), unit="percent", kind="trend", timing=False, cause=Cause.NONE)
    with pytest.raises(ValueError, match="a rate metric is a share"):
        metric("odd", filters=(), unit="count", kind="rate", timing=False, cause=Cause.NONE)


@pytest.mark.parametrize(
    ("lines", "words"),
    [
        ('pass: "p(95) <= 900ms", warn: "p(95) <= 1s"', "is looser than pass"),
        ('pass: "p(95) < 2s", warn: "p(95) <= 2001ms"', "write a number at most 2s"),
        ('pass: "p(95) <= 900ms", warn: "p(95) >= 100ms"', "bounds the other side"),
        ('pass: "p(95) != 0s", warn: "p(95) != 1s"', "has no stricter side"),
    ],
)
def test_a_warn_looser_than_pass_is_refused(tmp_path: Path, lines: str, words: str) -> None:
    message = refusal(tmp_path, f"  - {{id: g, title: G, metric: ttft, {lines}}}")
    assert "gates[0] (id: g).warn: " in message and words in message


def test_a_warn_on_a_lower_bound_is_at_least_pass(tmp_path: Path) -> None:
    entry = '  - {{id: g, title: G, metric: availability, pass: "rate >= 0.99", warn: "{}"}}'
    message = refusal(tmp_path, entry.format("rate >= 98%"))
    assert "gates[0] (id: g).warn: " in message and "write a number at least 0.99" in message
    for warn in ("rate >= 99%", "rate > 0.995"):  # as strict, or stricter
        assert load_gate_file(gate_file(tmp_path / "ok.yaml", entry.format(warn))).gates[0].warn


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ("blocks: true", "blocks takes the reason this gate blocks a release, as text"),
        ('blocks: "  "', "blocks is empty"),
        ('blocks: "false"', "which would read as its reason"),
        ("key: true", "a key gate blocks a release when it fails: say why"),
    ],
)
def test_a_gate_that_blocks_must_say_why(tmp_path: Path, flags: str, words: str) -> None:
    message = refusal(
        tmp_path, f'  - {{id: g, title: G, metric: oom_events, pass: "count == 0", {flags}}}'
    )
    assert "gates[0] (id: g).blocks: " in message and words in message


def test_the_reason_is_the_declaration(tmp_path: Path) -> None:
    """A text blocks and is the reason; `false` lets even a key gate only lower the score."""
    loaded = load_gate_file(
        gate_file(
            tmp_path / "g.yaml",
            '  - {id: a, title: A, metric: oom_events, pass: "count == 0", key: true,\n'
            "     blocks: an OOM kills every request on its replica}",
            '  - {id: b, title: B, metric: oom_events, pass: "count == 0", key: true,\n'
            "     blocks: false}",
        )
    )
    a, b = loaded.gates
    assert a.blocking and a.blocks_because == "an OOM kills every request on its replica"
    assert a.resolved({})["blocks"] == a.blocks_because
    assert b.key and not b.blocking and b.blocks_because is None
    assert b.resolved({})["blocks"] is False


def test_a_blocking_failure_says_why_wherever_it_is_reported(tmp_path: Path) -> None:
    run = RunBuilder().event("admitted", 20, request_id="a").event("oom", 50)
    run_dir = run.write(tmp_path / "run")
    judged = evaluate_run(run_dir)
    no_oom = gate(judged, "no_oom")
    assert no_oom.status == Status.FAIL and judged.status == Status.FAIL
    assert no_oom.blocks_because == NO_OOM_REASON
    assert no_oom.message.endswith(f"; blocks the release: {NO_OOM_REASON}")
    assert f"blocks the release: {NO_OOM_REASON}" in format_verdict(judged)
    case = next(
        c
        for c in ET.parse(run_dir / schema.JUNIT_FILE).getroot().iter("testcase")
        if c.get("name") == "no_oom"
    )
    failure = case.find("failure")
    assert failure is not None and NO_OOM_REASON in (failure.text or "")
    assert NO_OOM_REASON in (failure.get("message") or "")
    kept = Verdict.from_dict(json.loads((run_dir / schema.VERDICT_FILE).read_text()))
    assert gate(kept, "no_oom").blocks_because == NO_OOM_REASON
    assert gate(kept, "no_oom").spec["blocks"] == NO_OOM_REASON
    again = evaluate(load_run(run_dir), kept.gate_file())
    assert gate(again, "no_oom").message == no_oom.message


def test_a_gate_that_does_not_block_names_no_reason(tmp_path: Path) -> None:
    b = RunBuilder()
    for i in range(400):
        if i % 10:
            b.request(f"r{i}", t=20 + i * 0.1, ttft_s=0.1, e2e_s=0.2)
        else:
            b.request(f"r{i}", t=20 + i * 0.1, outcome="timeout", http_status=None)
    judged = evaluate(load_run(b.write(tmp_path / "run")), load_gate_file())
    timeouts = gate(judged, "timeouts_disconnects")
    assert timeouts.status == Status.FAIL and not timeouts.blocks
    assert timeouts.blocks_because is None and "blocks the release" not in timeouts.message


def test_a_verdict_keeps_what_it_judged_by_even_where_a_file_may_no_longer_say_it(
    tmp_path: Path,
) -> None:
    """A verdict.json written before reasons (and units) were required keeps `blocks: true`,
    a bare number of seconds and a warn that could not fire: judging the run again reads
    them as they judged, while a gate file that says the same is refused."""
    old = {
        "id": "ttft_critical_p95",
        "title": "t",
        "metric": "ttft",
        "pass": "p(95) <= 0.9",
        "warn": "p(95) <= 1",
        "key": True,
        "blocks": True,
        "params": {},
    }
    judged = verdict(Status.PASS, ttft_gate(spec=old))
    judged.fail_score_below = 0.75
    spec = judged.gate_file().gates[0]
    assert spec.blocking and spec.blocks_because is None
    assert spec.pass_.value == pytest.approx(0.9) and spec.resolved({})["blocks"] is True
    path = tmp_path / "old.yaml"
    path.write_text(json.dumps({"gates": [old]}))
    with pytest.raises(GateSpecError) as err:
        load_gate_file(path)
    assert paths(str(err.value)) == [
        "gates[0] (id: ttft_critical_p95).warn",
        "gates[0] (id: ttft_critical_p95).blocks",
    ]
    bare = '  - {id: t, title: T, metric: ttft, pass: "p(95) <= 0.9", blocks: slow answers}'
    with pytest.raises(GateSpecError, match=r"\.pass: ttft is in seconds"):
        load_gate_file(gate_file(tmp_path / "g.yaml", bare))


def test_a_gate_spec_in_python_is_held_to_the_same_rules() -> None:
    with pytest.raises(ValueError, match="blocks takes the reason"):
        GateSpec.model_validate(
            {"id": "g", "title": "G", "metric": "oom_events", "pass": "count == 0", "blocks": True}
        )


def _readme_table() -> dict[str, tuple[bool, str]]:
    text = (ROOT / "gates" / "README.md").read_text()
    section = text.split("### Which gates block", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|\s*(yes)?\s*\| (.+) \|$", section, flags=re.MULTILINE)
    return {gate_id: (key == "yes", reason) for gate_id, key, reason in rows}


def test_the_readme_lists_each_builtin_blocking_gate_with_its_reason() -> None:
    gates = load_gate_file(BUILTIN_GATES).gates
    declared = {g.id: (g.key, g.blocks_because) for g in gates if g.blocking}
    assert _readme_table() == declared


def test_the_readmes_example_gate_is_a_valid_gate_file() -> None:
    text = (ROOT / "gates" / "README.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    assert example is not None
    loaded = checked_gate_file(yaml.safe_load(example.group(1)), "the README's example")
    assert loaded.gates[0].blocks_because == _readme_table()["ttft_critical_p95"][1]
