"""The closed sets of names every stage shares, as StrEnums: priorities, request outcomes,
the load generator's own error codes, finish reasons, reject codes and server-event kinds,
each with the groupings and properties a stage asks of it defined once here.

A member is a `str` equal to its value, so it compares, hashes, serialises (JSON, Parquet,
pandas) and formats as the plain name; a table read back from a run directory holds those
plain names, and `rows["outcome"].isin(FAILED_OUTCOMES)` works on them directly.
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Final


class Priority(enum.StrEnum):
    """A request's class; members are in rank order, highest first: the order in which a
    scheduler serves and protects them. It comes from the authenticated identity only."""

    CRITICAL = "critical"
    INTERACTIVE = "interactive"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        """0 for critical (served first), 2 for batch."""
        return _PRIORITY_RANK[self]


_PRIORITY_RANK: Final = MappingProxyType({p: i for i, p in enumerate(Priority)})


class Outcome(enum.StrEnum):
    """How a request ended, as the load generator classifies it; every ending is one of
    these, and a request has exactly one."""

    OK = "ok"  # answered to the end of its stream or body
    CANCELLED = "cancelled"  # the client closed it on purpose
    REJECTED = "rejected"  # the server said "not now" (a refusal status or code)
    ERROR = "error"  # an error response that is no refusal, or an error inside the stream
    TIMEOUT = "timeout"  # the client stopped waiting
    DISCONNECTED = "disconnected"  # the connection closed before the ending
    PROTOCOL_ERROR = "protocol_error"  # the response broke HTTP, SSE or the OpenAI shape

    @property
    def failed(self) -> bool:
        """Neither answered, cancelled nor refused: something broke (FAILED_OUTCOMES)."""
        return self in FAILED_OUTCOMES

    @property
    def broken(self) -> bool:
        """The connection broke or stalled (BROKEN_OUTCOMES)."""
        return self in BROKEN_OUTCOMES

    @property
    def unserved(self) -> bool:
        """Neither answered nor cancelled by the client: refused or failed."""
        return self not in ANSWERED_OR_CANCELLED


# An explicit refusal is not a failure: a server that sheds load with 429/503 is doing its
# job, one whose requests error, time out or lose their connection is not.
FAILED_OUTCOMES: Final = frozenset(
    {Outcome.ERROR, Outcome.TIMEOUT, Outcome.DISCONNECTED, Outcome.PROTOCOL_ERROR}
)
# The failures of the connection itself rather than of a response (an `error` with no HTTP
# status is one too; a reader that has the status counts it).
BROKEN_OUTCOMES: Final = frozenset({Outcome.TIMEOUT, Outcome.DISCONNECTED, Outcome.PROTOCOL_ERROR})
# The endings that are neither the server's failure nor its refusal; a reader of a table
# counts every other value (a missing one too) as unserved.
ANSWERED_OR_CANCELLED: Final = frozenset({Outcome.OK, Outcome.CANCELLED})


class ClientCode(enum.StrEnum):
    """The `error_code` the load generator records for an ending it classified itself (a
    server's own code, such as a RejectCode, is recorded as the server sent it). The comment
    on each names the outcome it goes with."""

    HEAD_TIMEOUT = "head_timeout"  # timeout: no response head within head_timeout_s
    FIRST_TOKEN_TIMEOUT = "first_token_timeout"  # timeout: no token within its limit
    CLIENT_TIMEOUT = "client_timeout"  # timeout: no ending within timeout_s
    CONNECT_FAILED = "connect_failed"  # error: no connection to the target
    CONNECTION_CLOSED = "connection_closed"  # disconnected: closed before the ending
    CONNECTION_LOST = "connection_lost"  # disconnected: the socket failed
    PROTOCOL_ERROR = "protocol_error"  # protocol_error: not HTTP, SSE or the OpenAI shape
    STREAM_ERROR = "stream_error"  # error: an error event in the stream that names no code
    USER_STOPPED = "user_stopped"  # cancelled: the load generator stopped at the load's end
    # error: a stream that ended cleanly (`[DONE]`, or a finish_reason and the close) with
    # not one content chunk, although it asked for output. The server said it answered and
    # served nothing, so the request was not served: no first token, a failure.
    EMPTY_STREAM = "empty_stream"


def answered_empty(outcome: str, chunks: float | None, max_tokens: float | None) -> bool:
    """A record that says `ok` although its stream carried no content and it asked for
    output (max_tokens unset or above 0): the ending the client now records as an `error`
    with ClientCode.EMPTY_STREAM, as a client before that code wrote it. Readers of a run
    count it as that error. Unknown chunks (None or NaN) are taken as the record says."""
    return outcome == Outcome.OK and chunks == 0 and max_tokens != 0


class FinishReason(enum.StrEnum):
    """The OpenAI `finish_reason` values a gate reads (a server may send others)."""

    STOP = "stop"  # the model ended its answer (EOS, a stop string)
    LENGTH = "length"  # the answer reached max_tokens (or the context's end)
    ABORT = "abort"  # vLLM's: the engine gave the request up unfinished

    @property
    def normal(self) -> bool:
        """The request ran to its end (NORMAL_FINISHES); anything else was cut off."""
        return self in NORMAL_FINISHES


NORMAL_FINISHES: Final = frozenset({FinishReason.STOP, FinishReason.LENGTH})


class RejectCause(enum.StrEnum):
    """Why a server refused. `capacity` (no room: the pool, a watermark, a full queue, a queue
    deadline) is the server's limit; `policy` (a tenant's quota, a priority its key lacks) is
    a rule applied to one tenant. A capacity test's knee is where capacity refusals start;
    policy refusals are reported beside it and never end the ramp."""

    CAPACITY = "capacity"
    POLICY = "policy"


class RejectCode(enum.StrEnum):
    """The OpenAI error `code` of a refusal; each has its HTTP status and its cause."""

    TENANT_QUOTA = "tenant_quota"
    CAPACITY = "capacity"
    DEADLINE_EXPIRED = "deadline_expired"
    TOO_LONG = "too_long"
    PRIORITY_NOT_ALLOWED = "priority_not_allowed"

    @property
    def http_status(self) -> int:
        return _REJECT_STATUS[self]

    @property
    def cause(self) -> RejectCause | None:
        """Capacity or policy; None for a request no server could ever serve (too long)."""
        return _REJECT_CAUSE.get(self)

    @property
    def retryable(self) -> bool:
        """Whether the response carries Retry-After (waiting can help)."""
        return self.http_status in RETRY_STATUSES


_REJECT_STATUS: Final = MappingProxyType(
    {
        RejectCode.TENANT_QUOTA: 429,
        RejectCode.CAPACITY: 503,
        RejectCode.DEADLINE_EXPIRED: 503,
        RejectCode.TOO_LONG: 400,
        RejectCode.PRIORITY_NOT_ALLOWED: 403,
    }
)
_REJECT_CAUSE: Final = MappingProxyType(
    {
        RejectCode.TENANT_QUOTA: RejectCause.POLICY,
        RejectCode.CAPACITY: RejectCause.CAPACITY,
        RejectCode.DEADLINE_EXPIRED: RejectCause.CAPACITY,
        RejectCode.PRIORITY_NOT_ALLOWED: RejectCause.POLICY,
    }
)
# Statuses that mean "not now": they carry Retry-After, and a client counts them as refused
# whatever the body says. An explicit refusal is one of these, not a timeout.
RETRY_STATUSES: Final = (429, 503)


def rejection_cause(http_status: float | None, error_code: str | None) -> RejectCause | None:
    """The cause of one refused request: its code's when a server names a RejectCode, else
    by status (503: capacity, 429: policy); None when neither tells."""
    if error_code in _CODES:
        cause = RejectCode(error_code).cause
        if cause is not None:
            return cause
    if http_status == 503:
        return RejectCause.CAPACITY
    if http_status == 429:
        return RejectCause.POLICY
    return None


_CODES: Final = frozenset(RejectCode)


class EventKind(enum.StrEnum):
    """A `server_events` row's `event`: a request's transitions in the server's scheduler,
    and the replica lifecycle rows a server or the harness writes (no request)."""

    ADMITTED = "admitted"
    QUEUED = "queued"
    REJECTED = "rejected"
    PREEMPTED = "preempted"
    RESUMED = "resumed"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    RELEASED = "released"  # `blocks` is what it freed
    REPLICA_STARTED = "replica_started"
    REPLICA_DIED = "replica_died"
    OOM = "oom"  # the replica ran out of GPU memory (it dies right after)

    @property
    def lifecycle(self) -> bool:
        """A replica's row, not a request's (LIFECYCLE_EVENTS)."""
        return self in LIFECYCLE_EVENTS


LIFECYCLE_EVENTS: Final = frozenset(
    {EventKind.REPLICA_STARTED, EventKind.REPLICA_DIED, EventKind.OOM}
)
# The rows that end a replica's process: whatever it held is gone with it.
DEATH_EVENTS: Final = frozenset({EventKind.REPLICA_DIED, EventKind.OOM})
