"""Tenants: API keys -> tenant and allowed priority classes, plus each tenant's quota.

Loaded from a tenants YAML (`server/tenants.demo.yaml` is the default). `TenantBook` is the
one place keys are checked; the gateway and a standalone replica both authenticate with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from server.headers import same_secret
from server.protocol import ApiError
from server.scheduler import ConfigError, Priority, TenantQuota

DEFAULT_TENANTS_PATH = Path(__file__).with_name("tenants.demo.yaml")


class _TenantEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keys: list[str] = Field(min_length=1)
    priorities: list[Priority] = Field(min_length=1)
    quota: dict[str, Any]


class _TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    admin_keys: list[str] = Field(default_factory=list)
    tenants: dict[str, _TenantEntry] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is asking: the authenticated tenant and the priority class granted to this request."""

    tenant: str
    priority: Priority


class TenantBook:
    """Keys, admin keys and quotas. Invariant: every key maps to exactly one known tenant."""

    def __init__(
        self,
        keys: dict[str, tuple[str, tuple[Priority, ...]]],
        admin_keys: frozenset[str],
        quotas: dict[str, TenantQuota],
    ) -> None:
        self._keys = keys
        self._admin_keys = admin_keys
        self.quotas = quotas

    def authenticate(self, authorization: str | None, asked: str | None) -> Identity:
        """The identity for a bearer key and an optional X-Priority; ApiError 401/403 otherwise."""
        key = _bearer(authorization)
        entry = self._keys.get(key) if key else None
        if entry is None:
            what = "is missing" if not key else "is not a known API key"
            raise ApiError(
                401,
                "invalid_api_key",
                f"the API key {what}; send 'Authorization: Bearer <key>' with a key from the "
                f"tenants file",
            )
        tenant, allowed = entry
        if not asked:
            return Identity(tenant, allowed[0])
        try:
            priority = Priority(asked.strip().lower())
        except ValueError:
            raise ApiError(
                400,
                "invalid_request",
                f"X-Priority '{asked}' is not a priority class; use critical, interactive or batch",
            ) from None
        if not self._grants(priority, allowed):
            names = ", ".join(p.value for p in allowed)
            raise ApiError(
                403,
                "priority_not_allowed",
                f"tenant '{tenant}' may not use priority '{priority.value}'; its key allows "
                f"{names}",
            )
        return Identity(tenant, priority)

    def _grants(self, priority: Priority, allowed: tuple[Priority, ...]) -> bool:
        """May a key that allows `allowed` ask for `priority` in X-Priority?"""
        return priority in allowed

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant a bearer key belongs to, or None (no key, unknown key, admin key)."""
        key = _bearer(authorization)
        entry = self._keys.get(key) if key else None
        return entry[0] if entry else None

    def is_admin(self, authorization: str | None) -> bool:
        key = _bearer(authorization)
        return bool(key) and any(same_secret(key, k) for k in self._admin_keys)

    def require_admin(self, authorization: str | None, what: str = "this admin endpoint") -> None:
        if not self.is_admin(authorization):
            raise ApiError(
                401, "invalid_api_key", f"{what} needs 'Authorization: Bearer <admin key>'"
            )

    def require_any_key(self, authorization: str | None) -> None:
        """An admin or a tenant key: for what any client may read but strangers may not."""
        if not self.is_admin(authorization) and self.tenant_of(authorization) is None:
            raise ApiError(
                401,
                "invalid_api_key",
                "this endpoint needs 'Authorization: Bearer <key>' with a tenant or admin key",
            )


def _bearer(authorization: str | None) -> str:
    if not authorization:
        return ""
    scheme, _, value = authorization.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def load_tenants(
    path: str | Path = DEFAULT_TENANTS_PATH, book: type[TenantBook] = TenantBook
) -> TenantBook:
    """Parse and check a tenants YAML into a `book` (a TenantBook, or a mutant's subclass of
    it); ConfigError names the YAML path of each problem."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read tenants file {p}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"tenants file {p} is not valid YAML: {exc}") from None
    try:
        doc = _TenantsFile.model_validate(raw)
    except ValidationError as exc:
        where = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'file'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"tenants file {p}: {where}") from None
    keys: dict[str, tuple[str, tuple[Priority, ...]]] = {}
    quotas: dict[str, TenantQuota] = {}
    for name, entry in doc.tenants.items():
        try:
            quotas[name] = TenantQuota(name=name, **entry.quota)
        except (ValidationError, ValueError) as exc:
            raise ConfigError(f"tenants file {p}: tenants.{name}.quota: {exc}") from None
        for key in entry.keys:
            if key in keys or key in doc.admin_keys:
                raise ConfigError(f"tenants file {p}: key {key!r} is listed twice; keys are unique")
            keys[key] = (name, tuple(entry.priorities))
    return book(keys, frozenset(doc.admin_keys), quotas)
