"""The seed's scheduler numbers: the defaults the seed documents give the shipped scheduler.

The scheduler's configuration takes its defaults from here (server/scheduler/config.py), and
any stage that has to assume the seed's numbers when a run does not record its own (a chart's
reference lines, a synthetic run) reads them here too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class SeedNumbers:
    kv_pool_gib: float = 52.0  # the KV pool's hard size; never "all memory left after weights"
    block_tokens: int = 16  # tokens per KV block; reservations round up to whole blocks
    admission_watermark: float = 0.82  # pool usage above: stop admitting long batch requests
    batch_prefill_pause_watermark: float = 0.88  # above: pause batch prefill
    hard_watermark: float = 0.92  # commitments above: preempt recoverable work
    interactive_reserve: float = 0.25  # the share of the pool batch traffic can never take
    tenant_max_share: float = 0.15  # the hard cap of any tenant's share of the pool
    queue_deadline_ms: int = 8000  # queued requests are rejected, not left to time out
    max_new_tokens_default: int = 1024  # used when the client gives no max_tokens

    def watermarks(self) -> dict[str, float]:
        """The pressure ladder, by its config keys, lowest first."""
        return {
            "admission_watermark": self.admission_watermark,
            "batch_prefill_pause_watermark": self.batch_prefill_pause_watermark,
            "hard_watermark": self.hard_watermark,
        }

    def as_config(self) -> dict[str, float | int]:
        """Every number by its scheduler config key."""
        return asdict(self)


SEED: Final = SeedNumbers()
