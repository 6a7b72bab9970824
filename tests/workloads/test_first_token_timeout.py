"""The first-token deadline: a client that will not wait past it for its answer to begin,
against servers that send their response head at once and then queue (as vLLM does)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.workloads.fakes import FakeServer, fake_server
from workloads.client import StreamClient, StreamRequest, StreamResult


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with fake_server(tokens=5, gap_s=0.002) as srv:
        yield srv


def run(
    server: FakeServer,
    script: str,
    *,
    first_token_timeout_s: float,
    head_timeout_s: float | None = None,
    timeout_s: float = 60.0,
) -> StreamResult:
    request = StreamRequest(
        "/v1/chat/completions",
        b"{}",
        {"X-Fake": script},
        timeout_s=timeout_s,
        head_timeout_s=head_timeout_s,
        first_token_timeout_s=first_token_timeout_s,
    )
    result = StreamResult(request_id=script, t_send=0.0)
    StreamClient(server.url).stream(request, result)
    return result


def test_a_queued_request_ends_at_the_first_token_deadline(server: FakeServer) -> None:
    result = run(server, "queued", first_token_timeout_s=0.3, head_timeout_s=30.0)
    assert (result.outcome, result.error_code) == ("timeout", "first_token_timeout")
    assert result.chunks == 0 and result.ttft_s is None
    assert result.e2e_s is not None and result.e2e_s >= 0.3 - 0.001  # never before its time
    assert "first_token_timeout_s" in (result.error_message or "")


def test_the_deadline_ends_once_the_first_token_arrives(server: FakeServer) -> None:
    """Three tokens, then a stall: the stream had begun, so only the overall deadline ends
    it, as a client timeout with what arrived."""
    result = run(server, "stall_mid_stream", first_token_timeout_s=0.2, timeout_s=1.0)
    assert (result.outcome, result.error_code) == ("timeout", "client_timeout")
    assert result.chunks == 3 and result.ttft_s is not None


def test_a_stream_that_finishes_is_not_touched_by_its_deadline(server: FakeServer) -> None:
    result = run(server, "ok", first_token_timeout_s=30.0)
    assert result.outcome == "ok" and result.chunks == 5
