"""The shipped KV-cache scheduler: admission, quotas, pressure ladder, eviction, prefix sharing.

Pure Python: no I/O, no asyncio; deterministic given the injected clock.
"""

from contract import Priority, RejectCode
from server.scheduler.config import SEED_CONFIG_PATH, ConfigError, SchedulerConfig, TenantQuota
from server.scheduler.profiles import PROFILES, ModelProfile, get_profile
from server.scheduler.scheduler import Scheduler
from server.scheduler.types import (
    Admission,
    Decision,
    Event,
    PoolExhausted,
    PrefillChunk,
    PrefixSpec,
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
    "Decision",
    "Event",
    "ModelProfile",
    "PoolExhausted",
    "PrefillChunk",
    "PrefixSpec",
    "Priority",
    "RejectCode",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "SeqRequest",
    "SeqState",
    "StepPlan",
    "TenantQuota",
    "get_profile",
]
