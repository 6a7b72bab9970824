"""Plan validation: errors name the YAML path, the bad value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.plan import Plan, PlanError, ReferenceTarget, apply_override, load_plan

PLANS = Path(__file__).resolve().parents[2] / "harness" / "plans"

GOOD = """
name: t
target: {type: reference, replicas: 2, policy: seed}
traffic:
  classes:
    short_qa_critical: {weight: 1}
load: {users: 2, duration_s: 10}
faults:
  - {kind: kill, at_s: 5, replica: r1}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def test_a_good_plan_loads_with_defaults(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, GOOD))
    assert isinstance(plan.target, ReferenceTarget)
    assert plan.target.replicas == 2
    assert plan.samplers.nvml.interval_s == 0.25
    assert plan.planned_seconds() == plan.load.idle_before_s + 10 + plan.load.idle_after_s


def test_errors_name_the_yaml_path_value_and_allowed_values(tmp_path: Path) -> None:
    bad = GOOD.replace("policy: seed", "policy: greedy").replace("users: 2", "users: 0")
    bad = bad.replace("short_qa_critical: {weight: 1}", "batch: {weight: 1, colour: red}")
    with pytest.raises(PlanError) as err:
        load_plan(write(tmp_path, bad))
    text = str(err.value)
    assert "target.policy: Input should be 'seed', 'vllm', 'tgi' or 'naive' (got 'greedy')" in text
    assert "load.users:" in text and "(got 0)" in text
    assert "traffic.classes.batch.colour: unknown key; allowed keys: base, weight" in text


def test_unknown_traffic_class_names_the_known_ones(tmp_path: Path) -> None:
    bad = GOOD.replace("short_qa_critical: {weight: 1}", "short_qa: {weight: 1}")
    with pytest.raises(PlanError) as err:
        load_plan(write(tmp_path, bad))
    text = str(err.value)
    assert "traffic: traffic class 'short_qa' is not one of short_qa_critical" in text
    assert "give it `base: <one of them>`" in text
    renamed = GOOD.replace("short_qa_critical: {weight: 1}", "qa_sys: {base: short_qa_critical}")
    assert load_plan(write(tmp_path, renamed)).traffic.classes["qa_sys"].base == "short_qa_critical"


def test_a_base_must_be_a_registered_traffic_class(tmp_path: Path) -> None:
    bad = GOOD.replace("short_qa_critical: {weight: 1}", "qa: {base: short_qa}")
    with pytest.raises(PlanError) as err:
        load_plan(write(tmp_path, bad))
    assert (
        "traffic.classes.qa.base: 'short_qa' is not a traffic class; one of short_qa_critical, "
        "short_qa_interactive, long_context"
    ) in str(err.value)


def test_class_attributes_are_checked_against_the_class_when_the_plan_loads(
    tmp_path: Path,
) -> None:
    bad = GOOD.replace(
        "short_qa_critical: {weight: 1}",
        "short_qa_critical: {attributes: {max_tokens: many, phases: peak, align_s: 2}}\n"
        "    probe: {base: security_probe, attributes: {escalations: [[k, kn, t]], align_s: 2}}",
    )
    with pytest.raises(PlanError) as err:
        load_plan(write(tmp_path, bad))
    lines = str(err.value).splitlines()
    where = "  traffic.classes.short_qa_critical.attributes"
    assert len(lines) == 5 and lines[1:4] == [
        f"{where}.max_tokens: Input should be a valid integer (the attribute is int | None) "
        "(got 'many')",
        f"{where}.phases: Input should be a valid array (the attribute is tuple[str, ...]) "
        "(got 'peak')",
        "  traffic.classes.probe.attributes.escalations.0.3: Field required (the attribute is "
        "tuple[tuple[str, str, str, str], ...]) (got ['k', 'kn', 't'])",
    ]
    assert lines[4].startswith(
        "  traffic.classes.probe.attributes.align_s: security_probe has no such attribute; "
        "known: api_key, api_key_name, "
    )
    assert "hold_warm_tokens" in lines[4] and "align_delay_s" not in lines[4]


def test_fault_on_a_replica_the_target_lacks_is_named(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"replica 'r1'; this target has \['r0'\]"):
        load_plan(write(tmp_path, GOOD), ["target.replicas=1"])


def test_faults_need_a_reference_target(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="faults need a target kvgate runs"):
        load_plan(write(tmp_path, GOOD), ["target={type: external, url: 'http://127.0.0.1:1'}"])


def test_set_overrides_any_field_by_dotted_path(tmp_path: Path) -> None:
    plan = load_plan(
        write(tmp_path, GOOD),
        [
            "target.policy=naive",
            "load.users=7",
            "faults.0.at_s=2.5",
            "traffic.classes.batch.weight=3",
        ],
    )
    assert isinstance(plan.target, ReferenceTarget) and plan.target.policy == "naive"
    assert plan.load.users == 7 and plan.faults[0].at_s == 2.5
    assert plan.traffic.classes["batch"].weight == 3


def test_set_rejects_malformed_assignments() -> None:
    with pytest.raises(PlanError, match="KEY=VALUE"):
        apply_override({}, "target.policy")
    with pytest.raises(PlanError, match=r"index must be 0\.\.0"):
        apply_override({"faults": [{}]}, "faults.3.at_s=1")
    with pytest.raises(PlanError, match="the value is not valid YAML"):
        apply_override({}, "faults=[")
    with pytest.raises(PlanError, match="name is not a mapping"):
        apply_override({"name": "t"}, "name.x=1")


def test_not_yaml_and_missing_file_are_plan_errors(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="no such plan file"):
        load_plan(tmp_path / "absent.yaml")
    with pytest.raises(PlanError, match="not valid YAML"):
        load_plan(write(tmp_path, "a: [1,"))
    with pytest.raises(PlanError, match=r"cannot be read \(Is a directory\)"):
        load_plan(tmp_path)
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    with pytest.raises(PlanError, match=r"not UTF-8 text \(byte 9"):
        load_plan(tmp_path / "latin1.yaml")


def test_files_the_plan_names_must_exist(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, GOOD + "gates: mine.yaml\n"), ["target.tenants=t.yaml"])
    with pytest.raises(PlanError, match=r"gates: .*mine\.yaml is not a file"):
        plan.check_files()
    (tmp_path / "mine.yaml").write_text("version: 1\n")
    with pytest.raises(PlanError, match=r"target\.tenants: .*t\.yaml is not a file"):
        plan.check_files()
    (tmp_path / "t.yaml").write_text("tenants: {}\n")
    plan.check_files()


@pytest.mark.parametrize("name", ["smoke", "ci", "soak", "capacity"])
def test_shipped_plans_validate(name: str) -> None:
    plan = load_plan(PLANS / f"{name}.yaml")
    assert plan.name == name


UNTIL = GOOD.replace("load: {users: 2, duration_s: 10}", "load: {users: 2, until: decided, LIMITS}")


def until_plan(tmp_path: Path, limits: str, faults: str = "kill, at_s: 5") -> Plan:
    text = UNTIL.replace("LIMITS", limits).replace("kill, at_s: 5", faults)
    return load_plan(write(tmp_path, text))


def test_until_decided_runs_between_its_minimum_and_maximum(tmp_path: Path) -> None:
    plan = until_plan(tmp_path, "min_duration_s: 12, max_duration_s: 90")
    load = plan.load
    assert load.until == "decided" and (load.min_duration_s, load.max_duration_s) == (12, 90)
    # duration_s is the maximum, so the deadline, the console and the checks plan for it
    assert load.duration_s == 90 and plan.planned_seconds() == 3 + 90 + 5


def test_until_decided_defaults_its_limits_from_the_duration_and_the_faults(
    tmp_path: Path,
) -> None:
    """The maximum is duration_s; the minimum 30 s, or 10 s after the last fault, within the
    maximum. A fixed-length plan keeps duration_s and no limits."""
    plan = until_plan(tmp_path, "duration_s: 120")
    assert (plan.load.min_duration_s, plan.load.max_duration_s) == (30, 120)
    late = until_plan(tmp_path, "duration_s: 120", faults="kill, at_s: 70")
    assert late.load.min_duration_s == 80
    short = until_plan(tmp_path, "duration_s: 20")
    assert short.load.min_duration_s == 20 == short.load.max_duration_s
    fixed = load_plan(write(tmp_path, GOOD))
    assert fixed.load.until == "duration" and fixed.load.min_duration_s is None


def test_until_decided_limits_are_checked_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as err:
        until_plan(tmp_path, "min_duration_s: 100, max_duration_s: 60")
    assert (
        "load: min_duration_s (100 s) is longer than max_duration_s (60 s): the load would have "
        "to stop before it may; make min_duration_s at most max_duration_s"
    ) in str(err.value)
    with pytest.raises(PlanError) as err:
        load_plan(write(tmp_path, GOOD.replace("duration_s: 10", "min_duration_s: 5")))
    assert (
        "load: min_duration_s applies only to a load that runs until its gates are decided: "
        "set until: decided, or give the load's length as duration_s"
    ) in str(err.value)
    with pytest.raises(PlanError, match=r"load\.until: Input should be 'duration' or 'decided'"):
        load_plan(write(tmp_path, GOOD.replace("users: 2", "users: 2, until: forever")))


def test_a_fault_a_load_until_decided_may_stop_before_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as err:
        until_plan(tmp_path, "min_duration_s: 20, max_duration_s: 90", faults="kill, at_s: 40")
    assert (
        "faults.0 (kill at 40s) is not before load.min_duration_s (20s): a load that runs until "
        "decided may stop there, before the fault fires; raise min_duration_s past it"
    ) in str(err.value)


def test_the_bound_on_other_processes_cpu_is_a_share_of_the_host(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, GOOD))
    assert plan.samplers.host.enabled and plan.samplers.foreign_cpu_bound_share == 0.25
    bad = GOOD + "samplers: {foreign_cpu_bound_share: 25}\n"  # a percent, not a share
    with pytest.raises(PlanError) as err:
        load_plan(write(tmp_path, bad))
    assert "samplers.foreign_cpu_bound_share: Input should be less than or equal to 1" in str(
        err.value
    )
