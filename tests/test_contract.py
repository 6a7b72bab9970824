"""The contract: dependency-free, and what every stage shares means the same thing everywhere."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import contract
from contract import (
    EventKind,
    FinishReason,
    Outcome,
    Priority,
    RejectCause,
    RejectCode,
    ServerEvent,
)
from contract.enums import ANSWERED_OR_CANCELLED, BROKEN_OUTCOMES, FAILED_OUTCOMES
from gates.spec import BUILTIN_GATES
from gates.terms import Threshold

ROOT = Path(__file__).resolve().parents[1]
# The modules of the package with dependencies (pydantic; yaml for the profiles), imported
# only by name.
NOT_STDLIB_ONLY = {"servers.py", "runmeta.py"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0
    }


def test_contract_imports_only_the_standard_library() -> None:
    modules = sorted(p for p in (ROOT / "contract").glob("*.py") if p.name not in NOT_STDLIB_ONLY)
    assert len(modules) > 1
    allowed = set(sys.stdlib_module_names) | {"__future__", "contract"}
    for path in modules:
        assert _imports(path) <= allowed, path.name


def test_importing_the_contract_loads_nothing_outside_the_standard_library() -> None:
    """What `import contract` (and each stdlib-only module) actually loads, in a fresh
    interpreter: a stage that imports the contract drags in no other package."""
    names = [f"contract.{p.stem}" for p in (ROOT / "contract").glob("*.py")]
    names = [n for n in names if f"{n.split('.')[1]}.py" not in NOT_STDLIB_ONLY]
    script = (
        "import sys; before = set(sys.modules); import contract, "
        + ", ".join(n for n in names if not n.endswith("__init__"))
        + "; print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    foreign = [m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names | {"contract"}]
    assert "contract.enums" in loaded and foreign == []


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


def test_every_choice_the_plan_offers_the_reference_server_can_run() -> None:
    """The plan's choices are the contract's names; the server's registries hold the data
    behind each (a GPU's memory, a model's KV bytes). Its policies are built from the
    contract's names (server/scheduler/policies.py), so they need no check here."""
    from server.engine.gpus import GPUS
    from server.scheduler import PROFILES

    assert set(contract.GPUS) <= set(GPUS)
    assert set(contract.MODELS) <= set(PROFILES)


def test_the_security_probes_roles_are_the_contracts() -> None:
    from gates import metrics_security

    assert (metrics_security.ESCALATION, *metrics_security.ROLES) == contract.PROBE_ROLES
    assert {"asked_priority", "probe", "probe_group"} <= set(contract.REQUEST_COLUMNS)


# -- the enums ---------------------------------------------------------------------------


def test_priorities_are_in_rank_order() -> None:
    assert [p.rank for p in Priority] == [0, 1, 2]
    assert min(Priority, key=lambda p: p.rank) is Priority.CRITICAL
    assert contract.PRIORITIES == ("critical", "interactive", "batch")


def test_outcome_groupings() -> None:
    assert BROKEN_OUTCOMES < FAILED_OUTCOMES
    assert FAILED_OUTCOMES.isdisjoint(ANSWERED_OR_CANCELLED | {Outcome.REJECTED})
    assert {o for o in Outcome if o.unserved} == FAILED_OUTCOMES | {Outcome.REJECTED}
    assert [o for o in Outcome if o.failed] == [o for o in Outcome if o in FAILED_OUTCOMES]
    assert not Outcome.REJECTED.failed and Outcome.ERROR.failed and not Outcome.ERROR.broken


def test_an_ok_without_content_is_an_empty_answer_only_when_output_was_asked() -> None:
    from contract.enums import answered_empty

    assert answered_empty(Outcome.OK, 0, 64) and answered_empty("ok", 0, None)
    assert not answered_empty("ok", 0, 0)  # asked for no output: nothing is its answer
    assert not answered_empty("ok", 3, 64) and not answered_empty("error", 0, 64)
    assert not answered_empty("ok", float("nan"), 64)  # chunks unknown: as recorded
    assert FinishReason.STOP.normal and FinishReason.LENGTH.normal
    assert not FinishReason.ABORT.normal


def test_an_outcome_is_its_plain_name_on_every_path() -> None:
    assert json.dumps({"outcome": Outcome.OK}) == '{"outcome": "ok"}'
    assert f"{Outcome.PROTOCOL_ERROR}" == "protocol_error" and Outcome("ok") is Outcome.OK


@pytest.mark.parametrize(
    ("code", "status", "cause", "retryable"),
    [
        (RejectCode.TENANT_QUOTA, 429, RejectCause.POLICY, True),
        (RejectCode.CAPACITY, 503, RejectCause.CAPACITY, True),
        (RejectCode.DEADLINE_EXPIRED, 503, RejectCause.CAPACITY, True),
        (RejectCode.TOO_LONG, 400, None, False),
        (RejectCode.PRIORITY_NOT_ALLOWED, 403, RejectCause.POLICY, False),
    ],
)
def test_a_reject_code_has_its_status_cause_and_retry(
    code: RejectCode, status: int, cause: RejectCause | None, retryable: bool
) -> None:
    assert (code.http_status, code.cause, code.retryable) == (status, cause, retryable)


@pytest.mark.parametrize(
    ("status", "code", "cause"),
    [
        (503, "capacity", RejectCause.CAPACITY),
        (429, "deadline_expired", RejectCause.CAPACITY),  # the code says more than the status
        (503, "tenant_quota", RejectCause.POLICY),
        (503, None, RejectCause.CAPACITY),  # a server that names no code: by its status
        (429, "slow_down", RejectCause.POLICY),
        (400, "too_long", None),
        (500, None, None),
    ],
)
def test_rejection_cause_by_code_then_status(
    status: int, code: str | None, cause: RejectCause | None
) -> None:
    assert contract.rejection_cause(status, code) is cause


def test_lifecycle_events_are_the_replicas_own() -> None:
    lifecycle = {k for k in EventKind if k.lifecycle}
    assert lifecycle == {EventKind.REPLICA_STARTED, EventKind.REPLICA_DIED, EventKind.OOM}
    with pytest.raises(ValueError, match="released is a request's event"):
        ServerEvent.lifecycle(0.0, "r0", 1, EventKind.RELEASED, None)


# -- the records -------------------------------------------------------------------------


def test_both_writers_of_lifecycle_rows_write_the_same_row(tmp_path: Path) -> None:
    """The replica's own event log and the harness's monitor write lifecycle rows of one
    shape: no request, nothing held, and no pool reading (None, never a made-up 0)."""
    from harness.samplers.events import lifecycle_row
    from server.replica.events import EventLog

    log = EventLog("r0", tmp_path)
    log.append_lifecycle(EventKind.REPLICA_DIED, "exit_code=1")
    log.close()
    server = json.loads((tmp_path / "r0.events.jsonl").read_text())
    harness = json.loads(json.dumps(lifecycle_row(1.0, "r0", -1, EventKind.REPLICA_DIED, "x")))
    varies = {"t", "seq", "reason"}
    assert tuple(server) == tuple(harness) == contract.SERVER_EVENT_COLUMNS
    assert {k: v for k, v in server.items() if k not in varies} == {
        k: v for k, v in harness.items() if k not in varies
    }
    assert server["pool_used_blocks"] is None and server["pool_total_blocks"] is None


def test_records_keep_their_annotated_types_through_the_run_directory(tmp_path: Path) -> None:
    """A record written with enums comes back as plain names, each number column numeric."""
    from contract.records import column_types
    from gates import schema
    from gates.rundir import read_table
    from harness.rundir import TableWriter, compact

    event = ServerEvent(
        t=1.5, replica="r0", seq=3, request_id="a", tenant="acme", priority=Priority.BATCH,
        event=EventKind.RELEASED, blocks=4, reserved_tokens=0, used_tokens=0, reason=None,
        pool_used_blocks=None, pool_total_blocks=100,
    )  # fmt: skip
    writer = TableWriter(tmp_path, schema.SERVER_EVENTS)
    writer.write(event.row())
    writer.close()
    compact(tmp_path)
    frame = read_table(tmp_path, schema.SERVER_EVENTS).frame
    row = frame.iloc[0]
    assert (row["event"], row["priority"], row["blocks"], row["t"]) == ("released", "batch", 4, 1.5)
    assert math.isnan(row["pool_used_blocks"])
    numeric = {c for c, kind in column_types(ServerEvent).items() if kind is not str}
    assert {c for c in frame.columns if frame[c].dtype.kind == "f"} == numeric
