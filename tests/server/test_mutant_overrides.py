"""Mutants are overrides: each is a subclass of the part it breaks, installed by the composition
roots from the `mutants` module beside that part, and no shipped module checks for one."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from contract import Mutant
from server.gateway.app import Gateway
from server.gateway.mutants import RELAYS, relay_class
from server.gateway.relay import Relay, Routed
from server.gateway.supervisor import ReplicaProc
from server.mutants import TENANT_BOOKS, tenant_book_class
from server.replica.__main__ import parse_args as replica_args
from server.replica.loop import StepLoop
from server.replica.mutants import STEP_LOOPS, step_loop_class
from server.replica.runtime import ReplicaRuntime
from server.scheduler import Priority, Scheduler
from server.scheduler.mutants import SCHEDULERS, scheduler_class
from server.serve import parse_args as serve_args
from server.tenants import Identity, TenantBook

SERVER = Path(__file__).resolve().parents[2] / "server"
TABLES: list[tuple[type, dict[Mutant, type]]] = [
    (Scheduler, dict(SCHEDULERS)),
    (StepLoop, dict(STEP_LOOPS)),
    (Relay, dict(RELAYS)),
    (TenantBook, dict(TENANT_BOOKS)),
]


def test_every_mutant_overrides_at_least_one_part_and_nothing_else_changes() -> None:
    installed = {m for _, table in TABLES for m in table}
    assert installed == set(Mutant), f"mutants with no override: {set(Mutant) - installed}"
    for base, table in TABLES:
        for mutant, cls in table.items():
            assert issubclass(cls, base) and cls is not base, (mutant, cls)
    for pick, base in (
        (scheduler_class, Scheduler),
        (step_loop_class, StepLoop),
        (relay_class, Relay),
        (tenant_book_class, TenantBook),
    ):
        assert pick(None) is base
        table = next(t for b, t in TABLES if b is base)
        for mutant in Mutant:
            assert pick(mutant) is table.get(mutant, base)


def test_no_shipped_module_names_a_mutant() -> None:
    """Only the mutants modules may name one; a shipped module that did would be a test
    branch in the shipped path."""
    offenders = []
    for path in SERVER.rglob("*.py"):
        if path.name == "mutants.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if _names_mutant(node):
                offenders.append(f"{path.relative_to(SERVER)}:{getattr(node, 'lineno', 0)}")
    assert offenders == []


def _names_mutant(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "Mutant"
    if isinstance(node, ast.Attribute):
        return node.attr == "Mutant"
    return isinstance(node, ast.ImportFrom) and any(a.name == "Mutant" for a in node.names)


@pytest.mark.parametrize("mutant", [None, *Mutant])
def test_the_replica_and_the_gateway_build_the_mutants_parts(
    tmp_path: Path, mutant: Mutant | None
) -> None:
    flags = ["--state-dir", str(tmp_path)] + (["--mutant", mutant.value] if mutant else [])

    async def replica() -> ReplicaRuntime:
        runtime = ReplicaRuntime(replica_args(flags))
        runtime.prompts.close()
        runtime.events.close()
        return runtime

    rt = asyncio.run(replica())
    assert type(rt.scheduler) is scheduler_class(mutant)
    assert type(rt.loop) is step_loop_class(mutant)
    assert type(rt.tenants) is tenant_book_class(mutant)
    gateway = _gateway(tmp_path, mutant.value if mutant else None)
    assert type(gateway.relay) is relay_class(mutant)
    assert type(gateway.tenants) is tenant_book_class(mutant)


def _gateway(tmp_path: Path, mutant: str | None) -> Gateway:
    flags = ["--state-dir", str(tmp_path)] + (["--mutant", mutant] if mutant else [])
    gateway = Gateway(serve_args(flags), tmp_path, "internal-token")
    gateway.prompts.close()
    return gateway


def _routed(priority: Priority, stream: bool) -> Routed:
    return Routed(
        "r1", "acme/r1", Identity("acme", priority), "/v1/completions", b"{}", stream, 100, None
    )


@pytest.mark.parametrize("mutant", [None, Mutant.DOUBLE_HOLD_AFTER_FAILOVER.value])
def test_double_hold_keeps_the_dead_replicas_reservation(
    tmp_path: Path, mutant: str | None
) -> None:
    gateway = _gateway(tmp_path, mutant)
    r, dead = _routed(Priority.BATCH, stream=False), ReplicaProc("r0")
    gateway.ledger.reserve(r.key, "acme", Priority.BATCH, dead.id, r.tokens)
    gateway.relay._drop_hold(r, dead)
    if mutant is None:
        assert gateway.ledger.by_replica() == {}
    else:  # still held on the dead replica, under a key no request will ever release
        assert gateway.ledger.by_replica() == {"r0": 100} and not gateway.ledger.holds(r.key)


@pytest.mark.parametrize("mutant", [None, Mutant.QUEUE_INSTEAD_OF_REFUSE.value])
def test_queue_instead_of_refuse_lets_the_gateway_wait_forever_for_batch(
    tmp_path: Path, mutant: str | None
) -> None:
    relay = _gateway(tmp_path, mutant).relay
    assert relay._headers_timeout(_routed(Priority.INTERACTIVE, stream=True), 13.0) == 13.0
    assert relay._headers_timeout(_routed(Priority.BATCH, stream=False), 13.0) is None
    batch_stream = relay._headers_timeout(_routed(Priority.BATCH, stream=True), 13.0)
    assert batch_stream == (13.0 if mutant is None else None)
