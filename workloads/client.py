"""The streaming OpenAI client every traffic class shares: one request in, one measured ending out.

It reads the socket as bytes arrive (no 1 KiB buffering), times TTFT at the first chunk that
carries content (or, from a server that streams usage on every chunk, counts a token),
every inter-chunk gap and end-to-end on `time.perf_counter()`, takes token counts from the
usage chunks, cancels on purpose by closing the connection, and turns
every way a request can end into one `contract.Outcome` instead of
raising. Connections are kept alive and reused when the server ends the body cleanly.
"""

from __future__ import annotations

import time
from typing import Any

import gevent
from gevent import get_hub

from workloads.connection import Connection, Target
from workloads.exchange import Exchange, Stale
from workloads.request import StreamRequest, StreamResult
from workloads.wire import EventStream, ProtocolError

# How long to wait for the end of a chunked body after `data: [DONE]` (some servers send it
# a step later, some never) before giving the connection up for a new one.
DONE_GRACE_S = 0.05

__all__ = ["StreamClient", "StreamRequest", "StreamResult"]


class StreamClient:
    """Sends streaming requests to one target over a small pool of keep-alive connections.

    Invariant: `_idle` holds only connections whose previous response was read to its end;
    `_draining` those whose body is still being read to its end in the background (with the
    timer that gives up on them). Each exchange owns its connection exclusively.

    `continuous_usage`: the requests ask for usage on every chunk (vLLM's
    stream_options.continuous_usage_stats). Then a chunk whose usage counts a completion
    token before any content came is the first token's arrival: a token that is partial
    UTF-8 streams as "" content.
    """

    def __init__(self, base_url: str, continuous_usage: bool = False) -> None:
        self.target = Target(base_url)
        self.continuous_usage = continuous_usage
        self._idle: list[Connection] = []
        self._draining: dict[Connection, Any] = {}

    def stream(self, request: StreamRequest, result: StreamResult) -> None:
        """Runs `request` to its ending, filling `result` in place (also when the greenlet is
        killed, so the caller can still emit the record from a `finally`)."""
        t0 = time.perf_counter()
        result.t_send = time.time()
        if request.keep_text:
            result.text = []
        try:
            Exchange(self, request, result, t0, fresh=False).run()
        except Stale:
            # The server closed the idle connection as the request went out: once more, on
            # a new connection (the server never saw the first attempt).
            Exchange(self, request, result, t0, fresh=True).run()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
        for conn, timer in list(self._draining.items()):
            timer.close()
            conn.close()
        self._draining.clear()

    def acquire(self, connect_timeout_s: float, fresh: bool) -> tuple[Connection, bool]:
        """A connection for one request and whether it was reused (idle ones the server has
        closed meanwhile are dropped)."""
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.peer_closed():
                return conn, True
            conn.close()
        return Connection(self.target, connect_timeout_s), False

    def release(self, conn: Connection) -> None:
        self._idle.append(conn)

    def settle(self, conn: Connection, events: EventStream, keep_alive: bool) -> None:
        """After `data: [DONE]`: pool the connection once its body has ended. The end is read
        in the background, so the user never waits for a server that sends it late."""
        if not keep_alive:
            conn.close()
        elif events.done:
            self._idle.append(conn)
        elif conn.can_watch:
            self._drain_in_background(conn, events)
        else:
            self._drain_here(conn, events)

    def _drain_in_background(self, conn: Connection, events: EventStream) -> None:
        timer = get_hub().loop.timer(DONE_GRACE_S)

        def finish(keep: bool) -> None:
            if self._draining.pop(conn, None) is None:
                return  # already finished, or the client was closed
            conn.unwatch()
            timer.close()
            if keep:
                self._idle.append(conn)
            else:
                conn.close()

        def on_readable() -> None:
            try:
                got = conn.recv_now(False)
                if got is None:
                    return
                if not got[0]:
                    finish(False)
                    return
                events.feed(got[0])
            except (OSError, ProtocolError):
                finish(False)
                return
            if events.done:
                finish(True)

        self._draining[conn] = timer
        conn.watch(on_readable)
        timer.start(finish, False)

    def _drain_here(self, conn: Connection, events: EventStream) -> None:
        # False: the block just ends at the timeout (gevent's documented idiom; the stubs
        # allow only an exception or None)
        with gevent.Timeout(DONE_GRACE_S, False):  # type: ignore[arg-type]
            try:
                while not events.done:
                    data, _t, _read_at = conn.recv()
                    if not data:
                        break
                    events.feed(data)
            except (OSError, ProtocolError):
                pass  # unusable: closed below
        if events.done:
            self._idle.append(conn)
        else:
            conn.close()

    def request_bytes(self, request: StreamRequest) -> bytes:
        lines = [
            f"POST {self.target.base_path}{request.path} HTTP/1.1",
            f"Host: {self.target.host_header}",
            "Content-Type: application/json",
            "Accept: text/event-stream",
            f"Content-Length: {len(request.body)}",
        ]
        lines.extend(f"{name}: {value}" for name, value in request.headers.items())
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.body
