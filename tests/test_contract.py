"""The contract: one dependency-free module, and every stage's names and numbers agree with it."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest
import yaml

import contract
from gates import schema
from gates.spec import BUILTIN_GATES, Threshold

ROOT = Path(__file__).resolve().parents[1]


def test_contract_imports_only_the_standard_library() -> None:
    tree = ast.parse((ROOT / "contract" / "__init__.py").read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_contract_is_installed_as_a_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "contract*" in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]


def _passes() -> dict[str, Threshold]:
    gates = yaml.safe_load(BUILTIN_GATES.read_text())["gates"]
    return {g["id"]: Threshold.model_validate(g["pass"]) for g in gates}


@pytest.mark.parametrize(
    ("gate_id", "quantile", "op", "value"),
    [
        ("ttft_critical_p95", 95, "<=", contract.TTFT_CRITICAL_P95_S),
        ("cancel_release_p99", 99, "<", contract.CANCEL_RELEASE_P99_S),
        ("tenant_share_cap", None, "<=", contract.TENANT_MAX_SHARE),
        ("preempted_complete", None, ">", contract.PREEMPTED_COMPLETION_MIN),
    ],
)
def test_builtin_gate_numbers_are_the_contracts(
    gate_id: str, quantile: float | None, op: str, value: float
) -> None:
    threshold = _passes()[gate_id]
    assert (threshold.quantile, threshold.op, threshold.value) == (quantile, op, value)


def test_builtin_gate_filters_use_contract_names() -> None:
    for gate in yaml.safe_load(BUILTIN_GATES.read_text())["gates"]:
        flt = gate.get("filter") or {}
        assert set(flt.get("priority", [])) <= set(contract.PRIORITIES)
        assert set(flt.get("traffic_class", [])) <= set(contract.TRAFFIC_CLASSES)


def test_the_run_directory_schema_takes_its_names_from_the_contract() -> None:
    assert schema.REQUEST_COLUMNS is contract.REQUEST_COLUMNS
    assert schema.OUTCOMES is contract.OUTCOMES
    assert schema.TRAFFIC_CLASSES is contract.TRAFFIC_CLASSES
    assert schema.PRIORITIES is contract.PRIORITIES


def test_the_server_agrees_with_the_contract() -> None:
    """The server keeps enums and registries of its own (its types are richer than names);
    their names and numbers must be the contract's."""
    from server.engine.gpus import GPUS
    from server.scheduler import PROFILES, SchedulerConfig
    from server.scheduler.policies import POLICIES
    from server.scheduler.types import Priority, RejectReason

    assert tuple(p.value for p in Priority) == contract.PRIORITIES
    assert {r.value: r.http_status for r in RejectReason} == dict(contract.REJECT_STATUS)
    assert {r.value for r in RejectReason if r.retryable} == {
        code for code, status in contract.REJECT_STATUS.items() if status in contract.RETRY_STATUSES
    }
    assert set(POLICIES) == set(contract.POLICIES)
    assert set(GPUS) == set(contract.GPUS)
    assert set(PROFILES) == set(contract.MODELS)
    assert SchedulerConfig().tenant_max_share == contract.TENANT_MAX_SHARE
    assert SchedulerConfig().model == contract.DEFAULT_MODEL


def test_the_client_counts_the_contracts_refusals() -> None:
    """(The user classes are checked against contract.USER_CLASSES in tests/workloads.)"""
    from workloads.exchange import REJECTION_CODES, REJECTION_STATUSES

    assert set(contract.REJECT_CODES) == REJECTION_CODES
    assert set(contract.RETRY_STATUSES) == REJECTION_STATUSES


def _literal_values(annotation: object) -> set[object]:
    """The values a (possibly optional) Literal annotation allows."""
    if get_origin(annotation) is Literal:
        return set(get_args(annotation))
    return set().union(*(_literal_values(a) for a in get_args(annotation)))


def test_the_plan_offers_exactly_the_contracts_choices() -> None:
    from harness.plan import ReferenceTarget, TrafficClass

    fields = ReferenceTarget.model_fields
    assert _literal_values(fields["policy"].annotation) == set(contract.POLICIES)
    assert _literal_values(fields["gpu"].annotation) == set(contract.GPUS)
    assert _literal_values(fields["model"].annotation) == set(contract.MODELS)
    assert _literal_values(TrafficClass.model_fields["base"].annotation) == set(
        contract.USER_CLASSES
    )


def test_the_security_probes_roles_are_the_contracts() -> None:
    from gates import metrics_security

    assert (metrics_security.ESCALATION, *metrics_security.ROLES) == contract.PROBE_ROLES
    assert {"asked_priority", "probe", "probe_group"} <= set(contract.REQUEST_COLUMNS)
