"""Scheduler configuration (defaults: the seed's numbers, contract.seed) and tenant quotas, checked.

A config is bound to the model digest, runtime version and GPU SKU it was calibrated on; its
canonical digest (sha256 of sorted-key JSON) names it in reports and is what a rollback
returns to.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import contract
from contract import Priority
from contract.seed import SEED
from server.scheduler.profiles import PROFILES, ModelProfile, get_profile

GIB = 1 << 30
# An example config file: every key with its meaning and seed value, bound to the simulator.
SEED_CONFIG_PATH = Path(__file__).with_name("seed.yaml")


class ConfigError(ValueError):
    """A configuration that must not load; the message names the keys, numbers and the fix."""


class SchedulerConfig(BaseModel):
    """Seed defaults (contract.seed says what the seed's numbers mean). Watermarks are
    fractions of the KV pool (see Scheduler for what each one compares); the pool is a fixed
    size, never "all memory left after weights"."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kv_pool_gib: float = Field(SEED.kv_pool_gib, gt=0)
    block_tokens: int = Field(SEED.block_tokens, ge=1, le=1024)
    admission_watermark: float = Field(SEED.admission_watermark, gt=0, lt=1)
    batch_prefill_pause_watermark: float = Field(SEED.batch_prefill_pause_watermark, gt=0, lt=1)
    hard_watermark: float = Field(SEED.hard_watermark, gt=0, le=1)
    interactive_reserve: float = Field(SEED.interactive_reserve, ge=0, lt=1)
    # Share of the pool just below hard_watermark that only critical work may commit: without
    # it, interactive work commits right up to the hard line and a critical request that
    # finds no batch work to preempt queues until something finishes.
    critical_reserve: float = Field(0.02, ge=0, lt=1)
    tenant_max_share: float = Field(SEED.tenant_max_share, gt=0, le=1)
    queue_deadline_ms: int = Field(SEED.queue_deadline_ms, ge=1)
    max_new_tokens_default: int = Field(SEED.max_new_tokens_default, ge=1)
    model: str = contract.DEFAULT_MODEL
    overhead_factor: float = Field(1.05, ge=1.0, le=4.0)  # measured: allocator + metadata
    safety_factor: float = Field(1.10, ge=1.0, le=4.0)  # margin for estimation error
    step_token_budget: int = Field(8192, ge=1)  # most tokens batched in one step
    long_request_tokens: int = Field(8192, ge=1)  # input + max_new at or above this is "long"
    max_queued: int = Field(1024, ge=0)  # the wait queue's bound (never unbounded)
    max_running_seqs: int = Field(1024, ge=1)  # most sequences holding KV at once
    preempted_protection: float = Field(0.5, ge=0)  # V bonus per earlier preemption
    model_digest: str = "unbound"
    runtime_version: str = "unbound"
    gpu_sku: str = "unbound"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None

    @model_validator(mode="after")
    def _check(self) -> SchedulerConfig:
        if self.model not in PROFILES:
            raise ValueError(
                f"model {self.model!r} has no profile; use one of {', '.join(sorted(PROFILES))}"
            )
        if self.pool_blocks() < 1:
            raise ValueError(
                f"kv_pool_gib {self.kv_pool_gib} holds no {self.block_tokens}-token block at "
                f"{self.bytes_per_token} bytes per token; raise kv_pool_gib"
            )
        _check_watermarks(self)
        return self

    @property
    def profile(self) -> ModelProfile:
        return get_profile(self.model)

    @property
    def bytes_per_token(self) -> int:
        """Profile bytes x overhead x safety, rounded up (round first: float noise is not bytes)."""
        raw = self.profile.kv_bytes_per_token * self.overhead_factor * self.safety_factor
        return math.ceil(round(raw, 6))

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * self.bytes_per_token

    def pool_blocks(self) -> int:
        return int(self.kv_pool_gib * GIB) // self.block_bytes

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold `tokens` tokens (reservations round up to whole blocks)."""
        return -(-tokens // self.block_tokens)

    def step_growth_blocks(self) -> int:
        """Worst-case pool growth of one step: a step batches at most step_token_budget tokens."""
        return self.blocks_for(self.step_token_budget)

    def digest(self) -> str:
        """sha256 hex of the canonical JSON (sorted keys, no whitespace)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @classmethod
    def from_yaml(cls, path: str | Path) -> SchedulerConfig:
        """Load a YAML mapping of the keys above; anything wrong raises ConfigError."""
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read scheduler config {p}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"scheduler config {p} is not valid YAML: {exc}") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"scheduler config {p} must be a YAML mapping of keys to values")
        try:
            return cls(**{str(k): v for k, v in data.items()})
        except ConfigError as exc:
            raise ConfigError(f"{p}: {exc}") from None


def _check_watermarks(cfg: SchedulerConfig) -> None:
    """Watermarks in order, each gap at least one step's worst-case growth (else a single step
    could jump from "admit" straight past "preempt" and the ladder would never act in order)."""
    pool = cfg.pool_blocks()
    growth = cfg.step_growth_blocks() / pool
    ladder = (
        ("admission_watermark", cfg.admission_watermark),
        ("batch_prefill_pause_watermark", cfg.batch_prefill_pause_watermark),
        ("hard_watermark", cfg.hard_watermark),
    )
    for (lo_key, lo), (hi_key, hi) in itertools.pairwise(ladder):
        if lo >= hi:
            raise ValueError(
                f"{lo_key} ({lo}) must be below {hi_key} ({hi}); put the watermarks in "
                f"the order admission < batch_prefill_pause < hard"
            )
        if hi - lo < growth:
            raise ValueError(
                f"{lo_key} ({lo}) and {hi_key} ({hi}) are {hi - lo:.4f} apart, less than one "
                f"step's worst-case growth {growth:.4f} (step_token_budget "
                f"{cfg.step_token_budget} tokens = {cfg.step_growth_blocks()} of {pool} "
                f"blocks); widen the gap or lower step_token_budget"
            )
    if cfg.hard_watermark - cfg.critical_reserve <= 0:
        raise ValueError(
            f"critical_reserve ({cfg.critical_reserve}) leaves no room below hard_watermark "
            f"({cfg.hard_watermark}) for non-critical work; lower critical_reserve"
        )
    if 1.0 - cfg.hard_watermark < growth:
        raise ValueError(
            f"hard_watermark ({cfg.hard_watermark}) leaves {1.0 - cfg.hard_watermark:.4f} of "
            f"the pool, less than one step's worst-case growth {growth:.4f} (step_token_budget "
            f"{cfg.step_token_budget} tokens = {cfg.step_growth_blocks()} of {pool} blocks); "
            f"lower hard_watermark or step_token_budget"
        )


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        key = ".".join(str(x) for x in err["loc"]) or "config"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key; allowed keys: " + ", ".join(SchedulerConfig.model_fields)
        elif key != "config":
            msg = f"{msg} (got {err.get('input')!r})"
        parts.append(msg if key == "config" else f"{key}: {msg}")
    return "invalid scheduler config: " + "; ".join(parts)


class TenantQuota(BaseModel):
    """One tenant's limits. Hard quota rejects (429); tokens above the soft quota are allowed
    but make the tenant's queued work first in line for shedding under pressure."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    hard_reserved_tokens: int = Field(ge=1)
    soft_reserved_tokens: int = Field(ge=0)
    max_active_seqs: int = Field(ge=1)
    max_context_tokens: int = Field(ge=1)
    max_gpu_seconds: float = Field(gt=0)
    budgets: dict[Priority, int]  # reserved-token budget per priority class; absent = not allowed

    @model_validator(mode="after")
    def _check(self) -> TenantQuota:
        if self.soft_reserved_tokens > self.hard_reserved_tokens:
            raise ValueError(
                f"tenant {self.name}: soft_reserved_tokens ({self.soft_reserved_tokens}) is "
                f"above hard_reserved_tokens ({self.hard_reserved_tokens}); lower the soft quota"
            )
        return self

    def budget(self, priority: Priority) -> int:
        return self.budgets.get(priority, 0)
