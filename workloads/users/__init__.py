"""Locust user classes, one per traffic class, and the registry the harness builds plans from.

`USER_CLASSES` maps a plan's class name to its user class; records carry the coarser
`traffic_class` (both short Q&A variants record `short_qa`).
"""

from __future__ import annotations

from locust import User

from workloads.users.base import KvgateUser
from workloads.users.traffic import (
    Batch,
    CancelStorm,
    LongContext,
    LongOutput,
    MultiTurn,
    SecurityProbe,
    SharedPrefix,
    ShortQACritical,
    ShortQAInteractive,
    TenantBurst,
)

USER_CLASSES: dict[str, type[User]] = {
    "short_qa_critical": ShortQACritical,
    "short_qa_interactive": ShortQAInteractive,
    "long_context": LongContext,
    "long_output": LongOutput,
    "shared_prefix": SharedPrefix,
    "multi_turn": MultiTurn,
    "cancel_storm": CancelStorm,
    "tenant_burst": TenantBurst,
    "batch": Batch,
    "security_probe": SecurityProbe,
}

__all__ = ["USER_CLASSES", "KvgateUser"]
