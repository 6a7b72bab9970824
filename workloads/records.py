"""Per-request records and the one Locust hook they leave through.

A record is a `contract.RequestRecord` (the `requests` table's row). Every finished request fires
`environment.events.kvgate_record.fire(record=...)` exactly once — the harness listens there
and writes `requests.jsonl` — and Locust's own `request` event for the web UI and CSVs.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from locust.env import Environment
from locust.event import EventHook

from contract import Outcome, RequestRecord
from contract.quantiles import percentile_of_sorted
from workloads.client import StreamResult

RECORD_HOOK = "kvgate_record"
WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}"


@dataclass(slots=True, frozen=True)
class RequestMeta:
    """What the workload knows about a request before it is sent."""

    traffic_class: str
    tenant: str
    priority: str
    api_key_name: str | None
    target_prompt_tokens: int
    max_tokens: int | None
    label: str  # Locust request-event name suffix: `ttft:<label>`, `e2e:<label>`
    asked_priority: str | None = None  # the X-Priority header sent
    probe: str | None = None  # a security probe's role (contract.PROBE_ROLES)
    probe_group: str | None = None
    t_scheduled: float | None = None  # an open-loop request's planned send time (epoch s)
    prompt_blocks: str | None = None  # the prompt's block ids, space-separated


def build_record(meta: RequestMeta, result: StreamResult) -> RequestRecord:
    gaps = sorted(result.gaps)
    has_gaps = bool(gaps)
    return RequestRecord(
        request_id=result.request_id,
        traffic_class=meta.traffic_class,
        tenant=meta.tenant,
        priority=meta.priority,
        api_key_name=meta.api_key_name,
        replica=result.replica,
        worker=WORKER_NAME,
        t_send=result.t_send,
        ttft_s=result.ttft_s,
        e2e_s=result.e2e_s,
        itl_mean_s=sum(gaps) / len(gaps) if has_gaps else None,
        itl_p50_s=percentile_of_sorted(gaps, 50) if has_gaps else None,
        itl_p99_s=percentile_of_sorted(gaps, 99) if has_gaps else None,
        itl_max_s=gaps[-1] if has_gaps else None,
        chunks=result.chunks,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        cached_tokens=result.cached_tokens,
        target_prompt_tokens=meta.target_prompt_tokens,
        max_tokens=meta.max_tokens,
        outcome=result.outcome,
        http_status=result.http_status,
        error_code=result.error_code,
        error_message=result.error_message,
        retry_after_s=result.retry_after_s,
        cancel_at=result.cancel_at,
        finish_reason=result.finish_reason,
        asked_priority=meta.asked_priority,
        probe=meta.probe,
        probe_group=meta.probe_group,
        t_scheduled=meta.t_scheduled,
        prompt_blocks=meta.prompt_blocks,
    )


def install_record_hook(environment: Environment) -> EventHook:
    """Adds `environment.events.kvgate_record` once and returns it (idempotent).

    Listeners receive `record=RequestRecord`.
    """
    hook = getattr(environment.events, RECORD_HOOK, None)
    if hook is None:
        hook = EventHook()
        setattr(environment.events, RECORD_HOOK, hook)
    assert isinstance(hook, EventHook), f"events.{RECORD_HOOK} is taken by something else"
    return hook


class RequestFailure(Exception):
    """Locust shows this for requests that did not end `ok` or `cancelled`."""


def emit(environment: Environment, meta: RequestMeta, result: StreamResult) -> RequestRecord:
    """Fires the record hook once, then Locust's `request` events (TTFT and end-to-end rows)."""
    record = build_record(meta, result)
    install_record_hook(environment).fire(record=record)
    failed = Outcome(record.outcome).unserved
    exception = (
        # Outcome and code only: Locust groups failures by their text, and messages vary.
        RequestFailure(f"{record.outcome}: {record.error_code or 'no code'}") if failed else None
    )
    request_event = environment.events.request
    context: dict[str, Any] = {"request_id": record.request_id, "outcome": record.outcome}
    if record.ttft_s is not None:
        request_event.fire(
            request_type="SSE",
            name=f"ttft:{meta.label}",
            response_time=record.ttft_s * 1000.0,
            response_length=0,
            response=None,
            context=context,
            exception=None,
        )
    request_event.fire(
        request_type="SSE",
        name=f"e2e:{meta.label}",
        response_time=(record.e2e_s or 0.0) * 1000.0,
        response_length=result.bytes_received,
        response=None,
        context=context,
        exception=exception,
    )
    return record
