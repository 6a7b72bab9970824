"""The tenant book's named bug (each package has its own: server.scheduler.mutants,
server.replica.mutants, server.gateway.mutants): a subclass that the gateway and a standalone
replica load the tenants file into when the deployment carries it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from contract import Mutant, Priority
from server.tenants import TenantBook


class TrustPriorityHeader(TenantBook):
    """X-Priority is honoured beyond what the key allows (priority escalation)."""

    def _grants(self, priority: Priority, allowed: tuple[Priority, ...]) -> bool:
        return True


TENANT_BOOKS: Final[Mapping[Mutant, type[TenantBook]]] = MappingProxyType(
    {Mutant.TRUST_PRIORITY_HEADER: TrustPriorityHeader}
)


def tenant_book_class(mutant: Mutant | None) -> type[TenantBook]:
    """The tenant book to build for a deployment carrying `mutant` (TenantBook for most)."""
    return TenantBook if mutant is None else TENANT_BOOKS.get(mutant, TenantBook)
