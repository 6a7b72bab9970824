"""The two security mutants outside the scheduler: trust_priority_header lives in the tenant
book, which both the gateway and a standalone replica authenticate with."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from contract import Mutant
from server.gateway.app import Gateway
from server.mutants import tenant_book_class
from server.protocol import ApiError
from server.replica.__main__ import parse_args as replica_args
from server.replica.runtime import ReplicaRuntime
from server.scheduler import Priority
from server.serve import parse_args as serve_args
from server.tenants import DEFAULT_TENANTS_PATH, Identity, TenantBook, load_tenants

BATCH_KEY = "Bearer kvg-batch-key"  # batchco: batch only


def refusal(book: TenantBook, authorization: str, asked: str | None) -> tuple[int, str]:
    with pytest.raises(ApiError) as exc:
        book.authenticate(authorization, asked)
    return exc.value.status, exc.value.code


@pytest.mark.parametrize("mutant", [None, Mutant.SHARED_PRIVATE_PREFIX])
def test_without_the_mutant_a_priority_the_key_lacks_is_refused(mutant: Mutant | None) -> None:
    book = load_tenants(DEFAULT_TENANTS_PATH, tenant_book_class(mutant))
    assert refusal(book, BATCH_KEY, "critical") == (403, "priority_not_allowed")
    assert refusal(book, BATCH_KEY, "interactive") == (403, "priority_not_allowed")


def test_trust_priority_header_honours_any_x_priority_and_nothing_else() -> None:
    book = load_tenants(DEFAULT_TENANTS_PATH, tenant_book_class(Mutant.TRUST_PRIORITY_HEADER))
    assert book.authenticate(BATCH_KEY, "critical") == Identity("batchco", Priority.CRITICAL)
    assert book.authenticate(BATCH_KEY, "interactive").priority is Priority.INTERACTIVE
    # The rest of authentication is unchanged: the key's default, bad keys, bad values.
    assert book.authenticate(BATCH_KEY, None) == Identity("batchco", Priority.BATCH)
    assert refusal(book, "Bearer kvg-unknown-key", "critical")[0] == 401
    assert refusal(book, BATCH_KEY, "urgent") == (400, "invalid_request")


@pytest.mark.parametrize("mutant", [[], ["--mutant", "trust_priority_header"]])
def test_the_gateway_and_a_standalone_replica_authenticate_as_deployed(
    tmp_path: Path, mutant: list[str]
) -> None:
    flags = ["--state-dir", str(tmp_path), *mutant]
    gateway = Gateway(serve_args(flags), tmp_path, "internal-token")
    gateway.prompts.close()

    async def standalone() -> TenantBook:
        runtime = ReplicaRuntime(replica_args(flags))
        runtime.prompts.close()
        runtime.events.close()
        return runtime.tenants

    for book in (gateway.tenants, asyncio.run(standalone())):
        if mutant:
            assert book.authenticate(BATCH_KEY, "critical").priority is Priority.CRITICAL
        else:
            assert refusal(book, BATCH_KEY, "critical") == (403, "priority_not_allowed")
