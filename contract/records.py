"""The rows of the two tables every stage touches: a request (`RequestRecord`, written by the
load generator) and a server event (`ServerEvent`, written by a server or the harness).

Each dataclass *is* its table's definition: its fields are the columns, in order, and each
annotation is the column's type (`int`, `float` or text, `| None` where a value may be
missing). gates/schema.py derives the run directory's columns and their storage types from
them (`column_types`), so a new column is one field here.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Final

from contract.enums import EventKind, Outcome


@dataclasses.dataclass(slots=True)
class RequestRecord:
    """One row of the `requests` table: one request the load generator sent, exactly one
    whatever its ending. Times are epoch seconds, durations seconds from `t_send`."""

    request_id: str  # also sent as X-Request-Id
    traffic_class: str  # one of TRAFFIC_CLASSES
    tenant: str
    priority: str  # a Priority's value
    api_key_name: str | None  # which key of the tenant was used (never the key itself)
    replica: str | None  # the X-Replica response header
    worker: str  # the load-generator process that sent it
    t_send: float
    ttft_s: float | None  # the first chunk carrying content
    e2e_s: float | None  # send to the end of the stream or body
    itl_mean_s: float | None  # inter-token (chunk) gaps
    itl_p50_s: float | None
    itl_p99_s: float | None
    itl_max_s: float | None
    chunks: int  # content chunks received
    prompt_tokens: int | None  # from the server's usage
    completion_tokens: int | None
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens
    target_prompt_tokens: int  # what the workload aimed for
    max_tokens: int | None  # what was asked for
    outcome: Outcome
    http_status: int | None
    error_code: str | None  # the OpenAI error.code, or the client's own classification
    error_message: str | None
    retry_after_s: float | None
    cancel_at: float | None  # when the client closed the connection on purpose
    finish_reason: str | None
    asked_priority: str | None = None  # the X-Priority header sent (None when none was)
    probe: str | None = None  # a security probe's role, one of PROBE_ROLES (None: ordinary)
    probe_group: str | None = None  # links the requests of one private-prefix probe
    # An open-loop request's planned send time (epoch s): a trace replay sends each request
    # at its trace's arrival, and t_send - t_scheduled is how late it went. None for requests
    # of closed-loop users, which have no schedule to keep.
    t_scheduled: float | None = None
    # The prompt's prefix blocks as ids, space-separated: equal ids are identical blocks, so
    # two prompts share a prefix exactly as far as their ids agree (a trace's `hash_ids`).
    # meta.json's `prompt_block_tokens` says how many tokens a block holds.
    prompt_blocks: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ServerEvent:
    """One row of the `server_events` table: a request's transition in a server's scheduler,
    or a replica lifecycle row (no request). A value the writer does not know is None, never
    a made-up 0: readers tell the two apart (a pool of 0 blocks is no pool)."""

    t: float  # epoch s
    replica: str
    seq: int  # per replica; the rows the harness writes count down from -1
    request_id: str | None  # the client's X-Request-Id; None for lifecycle rows
    tenant: str | None
    priority: str | None  # a Priority's value (a server may name one of its own)
    event: EventKind
    blocks: int  # blocks the request holds after the event (`released`: blocks freed)
    reserved_tokens: int  # tokens reserved for the request after the event
    used_tokens: int  # tokens actually held in KV (prompt + generated) at the event
    reason: str | None  # a rejection, preemption or ending reason
    pool_used_blocks: int | None  # the replica's pool usage after the event
    pool_total_blocks: int | None

    @classmethod
    def lifecycle(
        cls, t: float, replica: str, seq: int, event: EventKind, reason: str | None
    ) -> ServerEvent:
        """A replica's own row: no request, nothing held, and no pool reading with it."""
        if not event.lifecycle:
            raise ValueError(f"{event} is a request's event, not a replica lifecycle row")
        return cls(t, replica, seq, None, None, None, event, 0, 0, 0, reason, None, None)

    def row(self) -> dict[str, Any]:
        """The row as a mapping of column to value, in column order."""
        return {name: getattr(self, name) for name in SERVER_EVENT_COLUMNS}


def columns(record: type) -> tuple[str, ...]:
    """A record dataclass's columns, in order."""
    return tuple(f.name for f in dataclasses.fields(record))


def column_types(record: type) -> dict[str, type]:
    """Each column's stored type, from its annotation: `int`, `float` or `str` (an enum's
    values are text). Optional columns (`X | None`) store the same type with nulls."""
    hints = typing.get_type_hints(record)
    out: dict[str, type] = {}
    for name in columns(record):
        kind = _base(hints[name])
        if issubclass(kind, bool) or not issubclass(kind, (str, int, float)):
            raise TypeError(f"{record.__name__}.{name}: {kind!r} is no column type")
        out[name] = str if issubclass(kind, str) else kind
    return out


def _base(annotation: Any) -> type:
    """`X` of `X` or `X | None`; anything else is no column type."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and isinstance(args[0], type):
            return args[0]
    elif isinstance(annotation, type):
        return annotation
    raise TypeError(f"{annotation!r} is no column type (give int, float, str or an enum)")


REQUEST_COLUMNS: Final = columns(RequestRecord)
SERVER_EVENT_COLUMNS: Final = columns(ServerEvent)
