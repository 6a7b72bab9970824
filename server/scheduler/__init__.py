"""The shipped KV-cache scheduler: admission, quotas, pressure ladder, eviction, prefix sharing.

Pure Python: no I/O, no asyncio; deterministic given the injected clock.
"""

from server.scheduler.config import SEED_CONFIG_PATH, ConfigError, SchedulerConfig, TenantQuota
from server.scheduler.profiles import PROFILES, ModelProfile, get_profile
from server.scheduler.scheduler import Scheduler
from server.scheduler.types import (
    Admission,
    Event,
    Outcome,
    PoolExhausted,
    PrefillChunk,
    PrefixSpec,
    Priority,
    RejectReason,
    SchedulerStats,
    SeqRequest,
    SeqState,
    StepPlan,
)

__all__ = [
    "PROFILES",
    "SEED_CONFIG_PATH",
    "Admission",
    "ConfigError",
    "Event",
    "ModelProfile",
    "Outcome",
    "PoolExhausted",
    "PrefillChunk",
    "PrefixSpec",
    "Priority",
    "RejectReason",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "SeqRequest",
    "SeqState",
    "StepPlan",
    "TenantQuota",
    "get_profile",
]
