"""The one place for the names and numbers every stage of kvgate agrees on.

Traffic classes, priorities, policies, GPUs and models, request outcomes, reject codes, the
columns of a request record and the release limits live here and nowhere else; a stage that
needs one imports it instead of keeping its own copy, so one change is made in one place.
This is a top-level package, not part of `gates` or `harness`, because every stage may
import it: the server (which the harness reaches only over HTTP and never imports),
the workloads (which may not import harness, gates or reports), the harness, the gates and
the reports. It imports nothing but the standard library, so importing it never drags one
stage into another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final

# -- what a request is --------------------------------------------------------------------

# A request record's `traffic_class` (the run directory's value).
TRAFFIC_CLASSES: Final = (
    "short_qa",
    "long_context",
    "long_output",
    "shared_prefix",
    "multi_turn",
    "cancel_storm",
    "tenant_burst",
    "batch",
    "security_probe",
)
# The Locust user classes a plan mixes: the traffic classes, with short Q&A split by
# priority (both of those record `short_qa`).
USER_CLASSES: Final = (
    "short_qa_critical",
    "short_qa_interactive",
    "long_context",
    "long_output",
    "shared_prefix",
    "multi_turn",
    "cancel_storm",
    "tenant_burst",
    "batch",
    "security_probe",
)
# Highest first: the order in which a scheduler serves and protects them.
PRIORITIES: Final = ("critical", "interactive", "batch")

# How every request ends, as the load generator classifies it.
OUTCOMES: Final = (
    "ok",
    "cancelled",
    "rejected",
    "error",
    "timeout",
    "disconnected",
    "protocol_error",
)

# -- how a server says no -------------------------------------------------------------------

# The OpenAI error `code` of a refusal and its HTTP status.
REJECT_STATUS: Final = MappingProxyType(
    {
        "tenant_quota": 429,
        "capacity": 503,
        "deadline_expired": 503,
        "too_long": 400,
        "priority_not_allowed": 403,
    }
)
REJECT_CODES: Final = tuple(REJECT_STATUS)
# Why a server refused: `capacity` (no room: the pool, a watermark, a full queue, a queue
# deadline) is the server's limit; `policy` (a tenant's quota, a priority its key lacks) is a
# rule applied to one tenant. A capacity test's knee is where capacity refusals start;
# policy refusals are reported beside it and never end the ramp.
REJECT_CAUSES: Final = MappingProxyType(
    {
        "capacity": ("capacity", "deadline_expired", "queue_full"),
        "policy": ("tenant_quota", "priority_not_allowed", "priority_budget"),
    }
)


def rejection_cause(http_status: float | None, error_code: str | None) -> str | None:
    """`capacity`, `policy` or None for one refused request: by its error code when a
    server names one (REJECT_CAUSES), else by status (503: capacity, 429: policy)."""
    for cause, codes in REJECT_CAUSES.items():
        if error_code in codes:
            return cause
    if http_status == 503:
        return "capacity"
    if http_status == 429:
        return "policy"
    return None


# Statuses that mean "not now": they carry Retry-After, and a client counts them as refused
# whatever the body says. An explicit refusal is one of these, not a timeout.
RETRY_STATUSES: Final = (429, 503)

# -- the system under test ------------------------------------------------------------------

POLICIES: Final = ("seed", "vllm", "tgi", "naive")
GPUS: Final = ("h100-80gb", "h200-141gb", "a100-80gb")
MODELS: Final = ("llama-3-8b", "llama-3-70b", "qwen2.5-7b")
DEFAULT_POLICY: Final = "seed"
DEFAULT_GPU: Final = "h100-80gb"
DEFAULT_MODEL: Final = "llama-3-8b"

# -- mutants: realistic scheduler and server bugs the reference server can carry ---------------
# Off by default; `kvgate serve --mutant NAME` (or a plan's `target.mutant`) switches one on.
# Each names the release gates that exist to catch it: `kvgate qualify` runs every mutant and
# checks that one of its gates FAILs (a mutant caught only by other gates is caught by
# accident, and the detection matrix says so).


@dataclass(frozen=True, slots=True)
class MutantSpec:
    gates: tuple[str, ...]  # the gates that must catch it, the most direct first
    summary: str  # one line: what the bug does


MUTANTS: Final = MappingProxyType(
    {
        "slow_release": MutantSpec(
            ("cancel_release_p99",), "the blocks of a cancelled request are freed 3 s late"
        ),
        "leak_on_cancel": MutantSpec(
            ("cancel_release_p99", "memory_back_to_idle"),
            "one cancellation in 20 never releases its blocks",
        ),
        "no_tenant_cap": MutantSpec(
            ("tenant_share_cap",), "the hard cap on one tenant's share of the pool is not enforced"
        ),
        "drop_preempted": MutantSpec(
            ("preempted_complete",), "preempted requests are aborted instead of resumed"
        ),
        "preempt_by_age": MutantSpec(
            ("critical_not_preempted", "ttft_critical_p95", "preempted_complete"),
            "victims are the newest running requests, whatever their priority or value",
        ),
        "batch_ignores_peak": MutantSpec(
            ("batch_stops_at_peak",),
            "batch work is admitted and prefilled whatever the pool's pressure",
        ),
        "queue_instead_of_refuse": MutantSpec(
            ("low_priority_explicit_errors",),
            "low-priority requests wait in the queue until the client gives up, instead of a "
            "429/503 with Retry-After",
        ),
        "double_hold_after_failover": MutantSpec(
            ("failover_no_double_reservation",),
            "a request retried on another replica stays reserved on the dead one",
        ),
        "underestimate_kv": MutantSpec(
            ("no_oom",),
            "a request's KV estimate leaves out its output allowance (max_tokens), and the "
            "scheduler counts commitments from that estimate",
        ),
        "trust_priority_header": MutantSpec(
            ("priority_escalation",),
            "the client's X-Priority is honoured beyond what its API key allows",
        ),
        "shared_private_prefix": MutantSpec(
            ("private_prefix_isolation",),
            "private prefixes are cached without the tenant in their key, so tenants share them",
        ),
    }
)

# The server's per-request events, plus the replica lifecycle rows the harness observes.
SERVER_EVENT_KINDS: Final = (
    "admitted",
    "queued",
    "rejected",
    "preempted",
    "resumed",
    "finished",
    "cancelled",
    "released",
    "replica_started",
    "replica_died",
    "oom",
)

# The reason a `preempted` event gives when the replica's own usage was past the hard
# watermark (it could run out of memory): the one case in which the seed policy may take
# critical work as a victim. Any other critical preemption breaks its victim order.
PREEMPT_AT_RISK: Final = "at_risk"

# -- one row per request --------------------------------------------------------------------

# The `requests` table's columns, in order; the workloads' record has exactly these fields.
REQUEST_COLUMNS: Final = (
    "request_id",  # str, also sent as X-Request-Id
    "traffic_class",  # one of TRAFFIC_CLASSES
    "tenant",  # str
    "priority",  # one of PRIORITIES
    "api_key_name",  # str | None: which key of the tenant was used (never the key itself)
    "replica",  # str | None: X-Replica response header
    "worker",  # str: the load-generator process that sent it
    "t_send",  # float epoch s
    "ttft_s",  # float | None: first chunk carrying content
    "e2e_s",  # float | None: send to end of stream / body
    "itl_mean_s",  # float | None: inter-token (chunk) gaps
    "itl_p50_s",
    "itl_p99_s",
    "itl_max_s",
    "chunks",  # int: content chunks received
    "prompt_tokens",  # int | None: from the server's usage
    "completion_tokens",  # int | None
    "cached_tokens",  # int | None: usage.prompt_tokens_details.cached_tokens
    "target_prompt_tokens",  # int: what the workload aimed for
    "max_tokens",  # int | None: what was asked for
    "outcome",  # one of OUTCOMES
    "http_status",  # int | None
    "error_code",  # str | None: OpenAI error.code, or the client's own classification
    "error_message",  # str | None
    "retry_after_s",  # float | None
    "cancel_at",  # float | None: epoch s the client closed the connection on purpose
    "finish_reason",  # str | None
    "asked_priority",  # str | None: the X-Priority header sent (None when none was)
    "probe",  # str | None: a security probe's role, one of PROBE_ROLES (None: ordinary traffic)
    "probe_group",  # str | None: links the requests of one private-prefix probe
)
# What a security probe request is for: asking a priority its key does not allow, or one of
# the three requests of a private-prefix probe (tenant A warms a private prefix, tenant B
# sends the identical prompt, and B sends one of the same shape that nothing can have cached).
PROBE_ROLES: Final = ("escalation", "prefix_warm", "prefix_probe", "prefix_control")

# -- the release limits ---------------------------------------------------------------------
# The gate file (gates/builtin.yaml) states these as data; a test keeps the two equal.

TTFT_CRITICAL_P95_S: Final = 0.9  # p95 time to first token of critical traffic, at most
CANCEL_RELEASE_P99_S: Final = 2.0  # p99 cancel to blocks released, under
TENANT_MAX_SHARE: Final = 0.15  # no tenant holds more of the KV pool than this
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


# A `network` fault's toxics (harness/netproxy.py, toxiproxy's semantics) and the attributes
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
