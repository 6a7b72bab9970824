"""The streaming client against scripted fake servers: every ending is classified, never raised.

Deadlines here are far longer than any request should take and shorter than the fakes'
stalls, so a client that waits where it should not ends in a timeout, whatever the machine's
speed; no test asserts how long a request took.
"""

from __future__ import annotations

from collections.abc import Iterator

import gevent
import pytest

from tests.waiting import wait_until
from tests.workloads.fakes import FakeServer, fake_server
from workloads import client as client_module
from workloads.client import StreamClient, StreamRequest, StreamResult
from workloads.connection import Connection

DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with fake_server(tokens=5, gap_s=0.002) as srv:
        yield srv


def run(
    client: StreamClient,
    script: str,
    timeout_s: float = DEADLINE_S,
    cancel_after_chunks: int | None = None,
    cancel_after_s: float | None = None,
    head_timeout_s: float | None = None,
) -> StreamResult:
    request = StreamRequest(
        "/v1/chat/completions",
        b"{}",
        {"X-Fake": script, "X-Request-Id": script},
        timeout_s=timeout_s,
        head_timeout_s=head_timeout_s,
        cancel_after_chunks=cancel_after_chunks,
        cancel_after_s=cancel_after_s,
        keep_text=True,
    )
    result = StreamResult(request_id=script, t_send=0.0)
    client.stream(request, result)
    return result


def test_ok_stream_times_content_not_role_and_takes_usage(server: FakeServer) -> None:
    result = run(StreamClient(server.url), "ok")
    assert result.outcome == "ok" and result.http_status == 200
    assert result.chunks == 5  # the role-only chunk and the usage chunk carry no content
    assert "".join(result.text or ()) == " word two words word word word"
    assert len(result.gaps) == 4 and all(g >= 0 for g in result.gaps)
    assert result.ttft_s is not None and result.e2e_s is not None
    assert 0 < result.ttft_s <= result.e2e_s
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (40, 6, 16)
    assert result.finish_reason == "length" and result.replica == "fake0"
    assert result.t_send > 1e9  # epoch seconds


def test_keep_alive_connections_are_reused(server: FakeServer) -> None:
    client = StreamClient(server.url)
    before = server.connections
    for _ in range(5):
        assert run(client, "ok").outcome == "ok"
    assert server.connections - before == 1


def test_server_keeping_the_connection_open_after_done_does_not_delay_the_ending(
    server: FakeServer,
) -> None:
    client = StreamClient(server.url)
    result = run(client, "keep_open")
    assert result.outcome == "ok" and result.chunks == 1
    (draining,) = client._draining  # the caller did not wait for the end of the body
    wait_until(lambda: not client._draining, what="the grace period to give the body up")
    assert not client._idle and draining.peer_closed()  # given up, not pooled
    connections = server.connections
    assert run(client, "ok").outcome == "ok"
    assert server.connections == connections + 1


def test_a_late_end_of_body_is_read_in_the_background(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A grace period no busy machine outlasts: the end comes late, but within it.
    monkeypatch.setattr(client_module, "DONE_GRACE_S", DEADLINE_S)
    client = StreamClient(server.url)
    assert run(client, "late_end").outcome == "ok"
    (draining,) = client._draining  # the caller did not wait for the end of the body
    assert not client._idle
    server.end_body.set()
    wait_until(lambda: client._idle, what="the late end of the body to be read")
    assert client._idle == [draining] and not client._draining
    connections = server.connections
    assert run(client, "ok").outcome == "ok"
    assert server.connections == connections  # reused


def test_closing_the_client_closes_connections_still_draining(server: FakeServer) -> None:
    client = StreamClient(server.url)
    assert run(client, "late_end").outcome == "ok"
    (draining,) = client._draining
    client.close()
    server.end_body.set()
    # Negative check: past the grace period, a drain still watching would have pooled it.
    gevent.sleep(client_module.DONE_GRACE_S * 4)
    assert not client._idle and not client._draining
    assert draining.peer_closed()  # our side is closed: the socket reports an error


def test_crlf_events_sent_one_byte_at_a_time(server: FakeServer) -> None:
    result = run(StreamClient(server.url), "crlf_bytewise")
    assert result.outcome == "ok" and "".join(result.text or ()) == " a b"


def test_body_until_close_without_chunking(server: FakeServer) -> None:
    result = run(StreamClient(server.url), "until_close")
    assert result.outcome == "ok" and result.finish_reason == "stop"


@pytest.mark.parametrize(
    ("script", "outcome", "code"),
    [
        ("malformed_json", "protocol_error", "protocol_error"),
        ("malformed_sse", "protocol_error", "protocol_error"),
        ("drop", "disconnected", "connection_closed"),
        ("server_error", "error", "http_500"),
        ("stream_error", "error", "replica_failed"),
    ],
)
def test_broken_endings_are_classified(
    server: FakeServer, script: str, outcome: str, code: str
) -> None:
    result = run(StreamClient(server.url), script)
    # Not a timeout: the client judged the bytes rather than wait for the stalling server.
    assert (result.outcome, result.error_code) == (outcome, code)
    assert result.error_message
    assert result.e2e_s is not None


def test_a_clean_stream_without_content_is_an_empty_stream_error(server: FakeServer) -> None:
    """HTTP 200, a finish_reason and [DONE], but not one content chunk: the server said it
    answered and served nothing. The stream ended cleanly, so its connection is kept."""
    client = StreamClient(server.url)
    result = run(client, "empty")
    assert (result.outcome, result.error_code) == ("error", "empty_stream")
    assert result.http_status == 200 and result.ttft_s is None and result.chunks == 0
    assert result.error_message and "finish_reason stop" in result.error_message
    assert result.e2e_s is not None
    connections = server.connections
    assert run(client, "ok").outcome == "ok" and server.connections == connections


def test_a_stream_that_asked_for_no_output_may_be_empty(server: FakeServer) -> None:
    request = StreamRequest(
        "/v1/chat/completions", b"{}", {"X-Fake": "empty"}, timeout_s=DEADLINE_S,
        expects_content=False,
    )  # fmt: skip
    result = StreamResult(request_id="none", t_send=0.0)
    StreamClient(server.url).stream(request, result)
    assert result.outcome == "ok" and result.error_code is None and result.chunks == 0


def test_rejection_keeps_status_code_message_and_retry_after(server: FakeServer) -> None:
    client = StreamClient(server.url)
    result = run(client, "reject")
    assert result.outcome == "rejected"
    assert (result.http_status, result.error_code, result.retry_after_s) == (429, "tenant_quota", 3)
    assert result.error_message == "tenant over quota"
    assert run(client, "ok").outcome == "ok"  # the error body was read to its end


def test_timeout_when_the_server_never_answers(server: FakeServer) -> None:
    result = run(StreamClient(server.url), "stall", timeout_s=0.3)
    assert result.outcome == "timeout" and result.error_code == "client_timeout"
    assert result.e2e_s is not None and result.e2e_s >= 0.3  # the timer fired, not early


def test_head_timeout_gives_up_on_a_server_that_sends_no_response_head(
    server: FakeServer,
) -> None:
    result = run(StreamClient(server.url), "stall", head_timeout_s=0.2)
    assert result.outcome == "timeout" and result.error_code == "head_timeout"
    assert result.e2e_s is not None and result.e2e_s >= 0.2


def test_head_timeout_does_not_bound_a_stream_that_has_begun(server: FakeServer) -> None:
    # slow_tokens answers its head at once, then paces a token every 10 ms: 20 tokens take
    # longer than head_timeout_s, and the stream is ended by the cancel, not the head timer.
    result = run(
        StreamClient(server.url), "slow_tokens", head_timeout_s=0.1, cancel_after_chunks=20
    )
    assert (result.outcome, result.error_code, result.chunks) == ("cancelled", None, 20)
    assert result.e2e_s is not None and result.e2e_s > 0.1


def test_cancel_after_k_content_chunks_closes_and_records_when(server: FakeServer) -> None:
    result = run(StreamClient(server.url), "slow_tokens", cancel_after_chunks=3)
    assert result.outcome == "cancelled" and result.chunks == 3
    assert result.cancel_at is not None and result.cancel_at >= result.t_send


def test_cancel_after_t_ms_even_without_data(server: FakeServer) -> None:
    result = run(StreamClient(server.url), "stall", cancel_after_s=0.1)
    assert result.outcome == "cancelled" and result.chunks == 0  # the cancel, not the deadline
    assert result.cancel_at is not None
    # Not early. Both stamps are wall-clock and t_send is taken a moment after the timer's
    # start, hence the millisecond of slack.
    assert result.cancel_at - result.t_send >= 0.1 - 0.001


def test_connection_refused_is_an_error_not_an_exception() -> None:
    with fake_server() as srv:
        url = srv.url
    result = run(StreamClient(url), "ok")
    assert (result.outcome, result.error_code) == ("error", "connect_failed")


def test_killed_greenlet_still_fills_its_result(server: FakeServer) -> None:
    result = StreamResult(request_id="k", t_send=0.0)
    headers = {"X-Fake": "stall", "X-Request-Id": "killed-waiting"}
    request = StreamRequest("/v1/chat/completions", b"{}", headers, timeout_s=DEADLINE_S)
    worker = gevent.spawn(StreamClient(server.url).stream, request, result)
    wait_until(lambda: "killed-waiting" in server.seen, what="the server to get the request")
    worker.kill(block=True)
    assert (result.outcome, result.error_code) == ("cancelled", "user_stopped")


@pytest.mark.parametrize(
    ("script", "outcome"),
    [("ok", "ok"), ("drop", "disconnected"), ("malformed_json", "protocol_error")],
)
def test_reading_in_the_greenlet_when_no_event_loop_callback_is_possible(
    server: FakeServer, script: str, outcome: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TLS connections read in the request's greenlet; plain ones are forced to here.
    monkeypatch.setattr(Connection, "can_watch", property(lambda _self: False))
    result = run(StreamClient(server.url), script)
    assert result.outcome == outcome
    if outcome == "ok":
        assert result.chunks == 5 and len(result.gaps) == 4 and result.completion_tokens == 6
    cancelled = run(StreamClient(server.url), "slow_tokens", cancel_after_chunks=2)
    assert cancelled.outcome == "cancelled" and cancelled.chunks == 2


def test_timeout_mid_stream_keeps_what_arrived(server: FakeServer) -> None:
    # stall_mid_stream sends three tokens at once, then nothing: the deadline ends it.
    result = run(StreamClient(server.url), "stall_mid_stream", timeout_s=1.0)
    assert (result.outcome, result.error_code, result.chunks) == ("timeout", "client_timeout", 3)
    assert result.ttft_s is not None and result.e2e_s is not None
    assert result.ttft_s < result.e2e_s


def test_killed_mid_stream_still_fills_its_result(server: FakeServer) -> None:
    result = StreamResult(request_id="k", t_send=0.0)
    headers = {"X-Fake": "slow_tokens"}
    request = StreamRequest("/v1/chat/completions", b"{}", headers, timeout_s=DEADLINE_S)
    worker = gevent.spawn(StreamClient(server.url).stream, request, result)
    wait_until(lambda: result.chunks > 0, what="the first token to arrive")
    worker.kill(block=True)
    assert (result.outcome, result.error_code) == ("cancelled", "user_stopped")
    assert result.chunks > 0


def test_idle_connection_closed_by_the_server_is_not_reused(server: FakeServer) -> None:
    client = StreamClient(server.url)
    assert run(client, "ok").outcome == "ok"
    (still_open,) = client._idle
    assert not still_open.peer_closed()
    assert run(client, "ok_then_close").outcome == "ok"
    (closed,) = client._idle
    wait_until(closed.peer_closed, what="the server's close to reach the idle connection")
    assert run(client, "ok").outcome == "ok"
    assert client._idle and client._idle[0] is not closed


def test_request_racing_the_servers_close_is_sent_again_on_a_new_connection(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = StreamClient(server.url)
    assert run(client, "ok_then_close").outcome == "ok"
    (closed,) = client._idle
    wait_until(closed.peer_closed, what="the server's close to reach the idle connection")
    monkeypatch.setattr(Connection, "peer_closed", lambda _self: False)  # lose the race
    result = run(client, "ok")
    assert result.outcome == "ok" and result.chunks == 5
