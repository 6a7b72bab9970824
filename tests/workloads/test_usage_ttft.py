"""TTFT and token counts from usage on every chunk (vLLM's continuous_usage_stats).

vLLM streams a token that is partial UTF-8 as "" content, so with usage on every chunk the
first token can arrive in a chunk with no text: its `usage.completion_tokens` says it came.
Each chunk here carries a `kvgate_emit_ts` marker, so a test sees which chunk the client
took as the first token without timing anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gevent
from gevent.pool import Pool
from gevent.server import StreamServer
from gevent.socket import socket as GSocket

from workloads.client import StreamClient, StreamRequest, StreamResult

HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"Connection: close\r\n\r\n"
)


def usage(completion: int, cached: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": 10,
        "completion_tokens": completion,
        "total_tokens": 10 + completion,
    }
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def delta(
    text: str, mark: float, completion: int | None, finish: str | None = None
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
        "kvgate_emit_ts": mark,
    }
    if completion is not None:
        chunk["usage"] = usage(completion)
    return chunk


ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
# As vLLM 0.32 streams with continuous_usage_stats: role chunk at 0 tokens, the first token
# partial UTF-8 (""), two tokens merged into one delta, cached tokens only at the very end.
CONTINUOUS = [
    {**ROLE, "usage": usage(0)},
    delta("", 1.0, 1),
    delta("\u00e9 and", 2.0, 3),
    delta(" more", 3.0, 4, "length"),
    {"choices": [], "usage": usage(4, cached=8)},
]


def sse(obj: object) -> bytes:
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    event = b"data: " + data + b"\n\n"
    return f"{len(event):x}\r\n".encode() + event + b"\r\n"


@contextmanager
def serving(events: list[Any], gap_s: float = 0.0) -> Iterator[str]:
    """A server that answers every request with `events` (one HTTP chunk each), then
    `[DONE]`; its URL."""

    def handle(sock: GSocket, _addr: object) -> None:
        try:
            buf = b""
            while b"\r\n\r\n" not in buf:
                more = sock.recv(65536)
                if not more:
                    return
                buf += more
            sock.sendall(HEAD)
            for event in [*events, b"[DONE]"]:
                sock.sendall(sse(event))
                if gap_s:
                    gevent.sleep(gap_s)
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the client went away (a cancel)
        finally:
            sock.close()

    server = StreamServer(("127.0.0.1", 0), handle, spawn=Pool())
    server.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.stop(timeout=0)


def run(url: str, continuous_usage: bool, cancel_after_chunks: int | None = None) -> StreamResult:
    request = StreamRequest(
        "/v1/chat/completions",
        b"{}",
        {},
        timeout_s=30.0,
        cancel_after_chunks=cancel_after_chunks,
        keep_text=True,
    )
    result = StreamResult(request_id="r", t_send=0.0)
    client = StreamClient(url, continuous_usage=continuous_usage)
    try:
        client.stream(request, result)
    finally:
        client.close()
    return result


def test_a_first_token_without_text_is_timed_where_usage_counts_it() -> None:
    with serving(CONTINUOUS) as url:
        result = run(url, continuous_usage=True)
    assert result.outcome == "ok" and result.ttft_s is not None
    assert result.first_emit_ts == 1.0  # the "" chunk, not the first with text
    assert result.chunks == 3 and len(result.gaps) == 2  # every chunk that brought tokens
    assert "".join(result.text or ()) == "\u00e9 and more"
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (10, 4, 8)


def test_without_continuous_usage_the_first_text_is_the_first_token() -> None:
    """A client that did not ask for usage on every chunk keeps timing content, whatever the
    server sends."""
    with serving(CONTINUOUS) as url:
        result = run(url, continuous_usage=False)
    assert result.first_emit_ts == 2.0 and result.chunks == 2
    assert (result.completion_tokens, result.cached_tokens) == (4, 8)


def test_the_final_usage_chunk_is_never_a_first_token() -> None:
    """A server that ignores continuous_usage_stats sends usage only at the end (no
    choices): a stream without text has no first token, as before, and so served nothing."""
    events = [ROLE, delta("", 1.0, None, "stop"), {"choices": [], "usage": usage(2, cached=0)}]
    with serving(events) as url:
        result = run(url, continuous_usage=True)
    assert (result.outcome, result.error_code) == ("error", "empty_stream")
    assert result.ttft_s is None and result.chunks == 0 and result.completion_tokens == 2


def test_the_role_chunk_at_zero_tokens_is_not_a_first_token() -> None:
    events = [{**ROLE, "usage": usage(0)}, delta(" hi", 1.0, 1, "stop")]
    with serving(events) as url:
        result = run(url, continuous_usage=True)
    assert result.first_emit_ts == 1.0 and result.chunks == 1


def test_a_cancelled_stream_counts_the_tokens_usage_reported_so_far() -> None:
    events = [{**ROLE, "usage": usage(0)}] + [
        delta("" if i == 0 else " w", float(i), i + 1) for i in range(50)
    ]
    with serving(events, gap_s=0.005) as url:
        result = run(url, continuous_usage=True, cancel_after_chunks=3)
    assert result.outcome == "cancelled" and result.first_emit_ts == 0.0
    assert result.chunks >= 3 and result.completion_tokens == result.chunks
