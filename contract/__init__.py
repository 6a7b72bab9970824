"""The one place for the names and numbers every stage of kvgate agrees on.

Traffic classes, priorities, policies, GPUs and models, request outcomes, reject codes, the
columns of a request record and the release limits live here and nowhere else; a stage that
needs one imports it instead of keeping its own copy, so one change is made in one place.
This is a top-level package, not part of `gates` or `harness`, because every stage may
import it: the server (which the harness reaches only over HTTP and never imports),
the workloads (which may not import harness, gates or reports), the harness, the gates and
the reports. It imports nothing but the standard library, so importing it never drags one
stage into another. contract/README.md says what lives where.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, Literal, get_args

# The enums and records, re-exported: `from contract import Outcome`. Their groupings
# (contract.enums), the percentile (contract.quantiles) and the seed's numbers
# (contract.seed) are imported from their modules.
from contract.enums import RETRY_STATUSES as RETRY_STATUSES
from contract.enums import ClientCode as ClientCode
from contract.enums import EventKind as EventKind
from contract.enums import FinishReason as FinishReason
from contract.enums import Outcome as Outcome
from contract.enums import Priority as Priority
from contract.enums import RejectCause as RejectCause
from contract.enums import RejectCode as RejectCode
from contract.enums import rejection_cause as rejection_cause
from contract.records import REQUEST_COLUMNS as REQUEST_COLUMNS
from contract.records import SERVER_EVENT_COLUMNS as SERVER_EVENT_COLUMNS
from contract.records import RequestRecord as RequestRecord
from contract.records import ServerEvent as ServerEvent
from contract.seed import SEED

# -- what a request is --------------------------------------------------------------------

# The values a request record's `traffic_class` may take: what a run directory holds, so
# that readers (a gate file's filters, the reports) know them without importing Locust, and
# a run made before a class was retired still reads. The classes themselves are not listed
# here: each is a user class of workloads/users/ that registers itself, and says which of
# these its records carry; tests/workloads/test_registry.py keeps the two equal.
TrafficClassName = Literal[
    "short_qa",
    "long_context",
    "long_output",
    "shared_prefix",
    "multi_turn",
    "cancel_storm",
    "tenant_burst",
    "batch",
    "security_probe",
]
TRAFFIC_CLASSES: Final[tuple[TrafficClassName, ...]] = get_args(TrafficClassName)
# The values of the enums, for Literal annotations and argparse choices (whose messages
# show a member as its repr); Priority's are in rank order, highest first.
PRIORITIES: Final = tuple(p.value for p in Priority)
OUTCOMES: Final = tuple(o.value for o in Outcome)
REJECT_CODES: Final = tuple(c.value for c in RejectCode)
SERVER_EVENT_KINDS: Final = tuple(k.value for k in EventKind)
# A priority's value, for a Literal annotation: pydantic validates it; mypy cannot read a
# Literal built at run time, so to it the value is the str it is.
if TYPE_CHECKING:
    PriorityName = str
else:
    PriorityName = Literal[PRIORITIES]

# -- the system under test ------------------------------------------------------------------

# Each list is a Literal type, so a plan's field is annotated with it and mypy checks the
# defaults; the tuple of its values is for argparse choices and messages.
PolicyName = Literal["seed", "vllm", "tgi", "naive"]
GpuName = Literal["h100-80gb", "h200-141gb", "a100-80gb"]
ModelName = Literal["llama-3-8b", "llama-3-70b", "qwen2.5-7b"]
POLICIES: Final[tuple[PolicyName, ...]] = get_args(PolicyName)
GPUS: Final[tuple[GpuName, ...]] = get_args(GpuName)
MODELS: Final[tuple[ModelName, ...]] = get_args(ModelName)
DEFAULT_POLICY: Final[PolicyName] = "seed"
DEFAULT_GPU: Final[GpuName] = "h100-80gb"
DEFAULT_MODEL: Final[ModelName] = "llama-3-8b"

# -- mutants: realistic scheduler and server bugs the reference server can carry ---------------
# Off by default; `kvgate serve --mutant NAME` (or a plan's `target.mutant`) switches one on.
# Each names the release gates that exist to catch it: `kvgate qualify` runs every mutant and
# checks that one of its gates FAILs (a mutant caught only by other gates is caught by
# accident, and the detection matrix says so).


class Mutant(enum.StrEnum):
    SLOW_RELEASE = "slow_release"
    LEAK_ON_CANCEL = "leak_on_cancel"
    NO_TENANT_CAP = "no_tenant_cap"
    DROP_PREEMPTED = "drop_preempted"
    PREEMPT_BY_AGE = "preempt_by_age"
    BATCH_IGNORES_PEAK = "batch_ignores_peak"
    QUEUE_INSTEAD_OF_REFUSE = "queue_instead_of_refuse"
    DOUBLE_HOLD_AFTER_FAILOVER = "double_hold_after_failover"
    UNDERESTIMATE_KV = "underestimate_kv"
    TRUST_PRIORITY_HEADER = "trust_priority_header"
    SHARED_PRIVATE_PREFIX = "shared_private_prefix"


@dataclass(frozen=True, slots=True)
class MutantSpec:
    gates: tuple[str, ...]  # the gates that must catch it, the most direct first
    summary: str  # one line: what the bug does


_SPECS: Final = MappingProxyType(
    {
        Mutant.SLOW_RELEASE: MutantSpec(
            ("cancel_release_p99",), "the blocks of a cancelled request are freed 3 s late"
        ),
        Mutant.LEAK_ON_CANCEL: MutantSpec(
            ("cancel_release_p99", "memory_back_to_idle"),
            "one cancellation in 20 never releases its blocks",
        ),
        Mutant.NO_TENANT_CAP: MutantSpec(
            ("tenant_share_cap",), "the hard cap on one tenant's share of the pool is not enforced"
        ),
        Mutant.DROP_PREEMPTED: MutantSpec(
            ("preempted_complete",), "preempted requests are aborted instead of resumed"
        ),
        Mutant.PREEMPT_BY_AGE: MutantSpec(
            ("critical_not_preempted", "ttft_critical_p95", "preempted_complete"),
            "victims are the newest running requests, whatever their priority or value",
        ),
        Mutant.BATCH_IGNORES_PEAK: MutantSpec(
            ("batch_stops_at_peak",),
            "batch work is admitted and prefilled whatever the pool's pressure",
        ),
        Mutant.QUEUE_INSTEAD_OF_REFUSE: MutantSpec(
            ("low_priority_explicit_errors",),
            "low-priority requests wait in the queue until the client gives up, instead of a "
            "429/503 with Retry-After",
        ),
        Mutant.DOUBLE_HOLD_AFTER_FAILOVER: MutantSpec(
            ("failover_no_double_reservation",),
            "a request retried on another replica stays reserved on the dead one",
        ),
        Mutant.UNDERESTIMATE_KV: MutantSpec(
            ("no_oom",),
            "a request's KV estimate leaves out its output allowance (max_tokens), and the "
            "scheduler counts commitments from that estimate",
        ),
        Mutant.TRUST_PRIORITY_HEADER: MutantSpec(
            ("priority_escalation",),
            "the client's X-Priority is honoured beyond what its API key allows",
        ),
        Mutant.SHARED_PRIVATE_PREFIX: MutantSpec(
            ("private_prefix_isolation",),
            "private prefixes are cached without the tenant in their key, so tenants share them",
        ),
    }
)
# Every mutant's spec by its name (plain text keys: a plan's Literal and an argparse choice
# show them as written).
MUTANTS: Final = MappingProxyType({m.value: _SPECS[m] for m in Mutant})
# A mutant's name, for a plan's field: a Literal of MUTANTS' keys, which pydantic validates.
# mypy cannot read a Literal built at run time, so to it the name is the str it is.
if TYPE_CHECKING:
    MutantName = str
else:
    MutantName = Literal[tuple(MUTANTS)]

# The reason a `preempted` event gives when the replica's own usage was past the hard
# watermark (it could run out of memory): the one case in which the seed policy may take
# critical work as a victim. Any other critical preemption breaks its victim order.
PREEMPT_AT_RISK: Final = "at_risk"

# -- one row per request --------------------------------------------------------------------

# What a security probe request is for: asking a priority its key does not allow, or one of
# the three requests of a private-prefix probe (tenant A warms a private prefix, tenant B
# sends the identical prompt, and B sends one of the same shape that nothing can have cached).
PROBE_ROLES: Final = ("escalation", "prefix_warm", "prefix_probe", "prefix_control")

# -- the release limits ---------------------------------------------------------------------
# The gate file (gates/builtin.yaml) states these as data; a test keeps the two equal.

TTFT_CRITICAL_P95_S: Final = 0.9  # p95 time to first token of critical traffic, at most
CANCEL_RELEASE_P99_S: Final = 2.0  # p99 cancel to blocks released, under
TENANT_MAX_SHARE: Final = SEED.tenant_max_share  # no tenant holds more of the pool than this
PREEMPTED_COMPLETION_MIN: Final = 0.99  # share of preempted requests that finish, above
# The SLO a request must meet to count as goodput (DistServe's definition: served, first token
# within its class's TTFT limit, and each later token within TPOT).
GOODPUT_TTFT_S: Final = MappingProxyType(
    {"critical": TTFT_CRITICAL_P95_S, "interactive": 2.0, "batch": math.inf}
)
GOODPUT_TPOT_S: Final = 0.1

# -- faults ---------------------------------------------------------------------------------
# Fault kinds are not listed here: each is one module of harness/faults/kinds/ that registers
# itself and declares its effect. What the gates need of a fault is that effect.


class FaultEffect(StrEnum):
    """What a fault did to what it targets, as its kind declares it: the faults table's
    `effect`. The gates read this, never a kind's name, so a new kind needs no gate change."""

    KILLS = "kills"  # the target's process is gone, and every reservation it held with it
    PAUSES = "pauses"  # the target's process is frozen (SIGSTOP) until the rollback
    BREAKS_CONNECTIONS = "breaks_connections"  # the traffic's path resets or stalls connections
    DEGRADES_NETWORK = "degrades_network"  # the traffic's path is slowed; connections survive
    NONE = "none"  # nothing the gates account for (a CONT, a HUP, a throttle command)

    @property
    def on_network(self) -> bool:
        """It acts on the path between the load generator and the target, not in the target."""
        return self in (FaultEffect.BREAKS_CONNECTIONS, FaultEffect.DEGRADES_NETWORK)


# A `network` fault's toxics (harness/netproxy/proxy.py, toxiproxy's semantics) and the attributes
# each takes.
TOXIC_ATTRIBUTES: Final = MappingProxyType(
    {
        "latency": ("latency", "jitter"),  # each chunk held latency +- jitter ms
        "bandwidth": ("rate",),  # KB/s, > 0
        "reset_peer": ("timeout",),  # the next chunk held this many ms, then TCP RST
        "timeout": ("timeout",),  # data dropped; closed after this many ms (0: never)
        "slow_close": ("delay",),  # a close passed on this many ms late
    }
)
TOXIC_TYPES: Final = tuple(TOXIC_ATTRIBUTES)
# A toxic's type, for a fault's field: a Literal of TOXIC_TYPES, which pydantic validates
# (to mypy, which cannot read a Literal built at run time, the str it is).
if TYPE_CHECKING:
    ToxicType = str
else:
    ToxicType = Literal[TOXIC_TYPES]
