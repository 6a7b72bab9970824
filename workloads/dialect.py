"""`Dialect`: which of kvgate's request extensions go out to one target, and in what form.

Built once per target from its server profile (contract/profiles/) and what the plan switched
off, and set on every user class (`KvgateUser.dialect`); each request's body and headers
follow it, so no traffic class decides per request what a server understands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from contract import PRIORITIES
from contract.servers import ServerProfile

SALT_PREFIX = "kvgate-tenant:"


@dataclass(frozen=True, slots=True)
class Dialect:
    """What requests to one target carry beyond the OpenAI API.

    The defaults are what a user class sends when no harness set its target's dialect (a
    class used on its own, as in tests): the X-Priority header and ignore_eos, nothing else.
    Invariant: `priority_values`, when set, maps every one of contract.PRIORITIES.
    """

    priority_header: bool = True  # X-Priority: <class name>
    priority_values: Mapping[str, int] | None = None  # body `priority`: each class's value
    cache_salt: bool = False  # body `cache_salt`: the tenant's, except on public prefixes
    min_tokens: bool = False
    ignore_eos: bool = True
    continuous_usage_stats: bool = False  # stream_options: usage on every chunk

    def __post_init__(self) -> None:
        values = self.priority_values
        if values is not None:
            missing = [p for p in PRIORITIES if p not in values]
            if missing:
                raise ValueError(f"priority_values has no value for {', '.join(missing)}")
            object.__setattr__(self, "priority_values", MappingProxyType(dict(values)))

    @classmethod
    def for_profile(
        cls, profile: ServerProfile, sends: Callable[[str], bool] | None = None
    ) -> Dialect:
        """The dialect of a `profile` server; `sends` (an extension's name: whether it goes
        out) narrows what the profile accepts, as a plan's `target.extensions` does."""
        on = sends or profile.accepts
        return cls(
            priority_header=on("priority_header"),
            priority_values=profile.priority_values if on("priority_field") else None,
            cache_salt=on("cache_salt"),
            min_tokens=on("min_tokens"),
            ignore_eos=on("ignore_eos"),
            continuous_usage_stats=on("continuous_usage_stats"),
        )

    @property
    def carries_priority(self) -> bool:
        """Whether a request can ask for a priority at all (header, field or both)."""
        return self.priority_header or self.priority_values is not None

    @staticmethod
    def salt(tenant: str) -> str:
        """The `cache_salt` of a tenant's private requests: the same for all of them, so they
        share their own prefixes, and different from every other tenant's."""
        return SALT_PREFIX + tenant
