"""What one streaming request sends (`StreamRequest`) and how it ended (`StreamResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from contract import Outcome


@dataclass(slots=True)
class StreamRequest:
    """What to send and how to end it: path below the target URL, JSON body, headers, limits."""

    path: str
    body: bytes
    headers: dict[str, str]
    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    # Give up when no response head has arrived this long after sending (None: only
    # timeout_s bounds it): a client that will not wait in a server's queue indefinitely.
    head_timeout_s: float | None = None
    # Give up when no token has arrived this long after sending (None: only timeout_s and
    # head_timeout_s bound it): a client with a deadline for its answer to begin, such as a
    # pipeline that will not wait in a queue past the seed's queue deadline. A server that
    # sends its response head at once and then queues the request (vLLM) meets this one.
    first_token_timeout_s: float | None = None
    cancel_after_chunks: int | None = None
    # False when the body asks for no output (max_tokens 0): a stream without content is
    # then its answer, not an empty stream.
    expects_content: bool = True
    cancel_after_s: float | None = None
    keep_text: bool = False


@dataclass(slots=True)
class StreamResult:
    """The measured ending of one request. Durations are seconds from `t_send`."""

    request_id: str
    t_send: float  # epoch s, taken together with the perf_counter origin of every duration
    outcome: Outcome = Outcome.ERROR
    http_status: int | None = None
    error_code: str | None = None
    error_message: str | None = None
    retry_after_s: float | None = None
    replica: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    gaps: list[float] = field(default_factory=list)
    chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    cancel_at: float | None = None
    text: list[str] | None = None
    bytes_received: int = 0
    first_emit_ts: float | None = None  # server's kvgate_emit_ts on the first content chunk
    # When the read holding the first content returned (ttft_s is when it arrived, from the
    # kernel's receive stamp where there is one): the difference is this process's delay.
    ttft_read_s: float | None = None
