"""The user classes a plan builds, as kvgate's own: `build_user_classes` hands them on as
Locust `User` classes (what Locust's runners take), while tests read kvgate's attributes."""

from __future__ import annotations

from harness.plan import Plan
from harness.traffic import build_user_classes
from workloads.users import KvgateUser


def built_user_classes(plan: Plan, host: str) -> list[type[KvgateUser]]:
    """The plan's user classes, each checked to be a `KvgateUser`."""
    built = build_user_classes(plan, host)
    ours = [cls for cls in built if issubclass(cls, KvgateUser)]
    assert ours == built, f"not kvgate users: {sorted(set(map(str, built)) - set(map(str, ours)))}"
    return ours
