"""One streaming request's life on one connection: send, response head, body, ending.

`Exchange` measures as it reads and turns every ending into an outcome. Token events are
handled in the event loop's read callback (no greenlet switch per token); the request's own
greenlet waits once for the stream to end, bounded by one gevent.Timeout.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import gevent
from gevent import GreenletExit
from gevent.hub import Waiter

import contract
from contract import ClientCode, Outcome
from workloads.connection import Connection
from workloads.request import StreamRequest, StreamResult
from workloads.wire import (
    MAX_HEAD_BYTES,
    BodyDecoder,
    EventStream,
    LengthDecoder,
    ProtocolError,
    ResponseHead,
    body_decoder,
    error_fields,
    error_object_fields,
    json_object,
    parse_head,
)

if TYPE_CHECKING:
    from workloads.client import StreamClient

MAX_ERROR_BODY_BYTES = 256 * 1024


class End(Exception):
    """Raised inside an exchange to end it with an outcome."""

    def __init__(self, outcome: Outcome, code: str | None = None, message: str | None = None):
        super().__init__(outcome, code, message)
        self.outcome, self.code, self.message = outcome, code, message


class Stale(Exception):
    """A reused keep-alive connection was already closed by the server: retry on a fresh one."""


class Exchange:
    """One request on one connection, from send to ending. Used once.

    Invariant: a single gevent.Timeout, armed for the earlier of the deadline and the
    cancel-after-t time, bounds every wait of the exchange.
    """

    def __init__(
        self,
        client: StreamClient,
        request: StreamRequest,
        result: StreamResult,
        t0: float,
        fresh: bool,
    ) -> None:
        self.client, self.request, self.result, self.t0 = client, request, result, t0
        self.fresh = fresh  # True: do not take a pooled connection
        self.deadline = t0 + request.timeout_s
        cancel_s = request.cancel_after_s
        self.cancel_t = t0 + cancel_s if cancel_s is not None else float("inf")
        head_s = request.head_timeout_s
        self.head_timer = gevent.Timeout(head_s) if head_s is not None else None
        first_s = request.first_token_timeout_s
        self.first_timer = gevent.Timeout(first_s) if first_s is not None else None
        self.conn: Connection | None = None
        self.reused = False
        self.last_t = 0.0
        self.read_at = 0.0  # when the last read returned
        self.settling = False  # the stream has ended; its connection is being settled

    def run(self) -> None:
        timer = gevent.Timeout(max(min(self.deadline, self.cancel_t) - time.perf_counter(), 0.0))
        timer.start()
        try:
            self._exchange()
        except gevent.Timeout as fired:
            if fired is self.head_timer:
                self._end(Outcome.TIMEOUT, ClientCode.HEAD_TIMEOUT, self._head_timeout_message())
            elif fired is self.first_timer:
                limit = self.request.first_token_timeout_s
                message = f"no first token within {limit:g} s (first_token_timeout_s)"
                self._end(Outcome.TIMEOUT, ClientCode.FIRST_TOKEN_TIMEOUT, message)
            elif fired is timer:
                self._on_timer()
            else:
                raise
        except End as end:
            self._end(end.outcome, end.code, end.message)
        except ProtocolError as exc:
            self._end(Outcome.PROTOCOL_ERROR, ClientCode.PROTOCOL_ERROR, str(exc))
        except OSError as exc:
            if self.reused and self.result.bytes_received == 0:
                self._close()
                raise Stale from exc
            self._end(
                Outcome.DISCONNECTED, ClientCode.CONNECTION_LOST, f"{type(exc).__name__}: {exc}"
            )
        except GreenletExit:
            self._end(
                Outcome.CANCELLED, ClientCode.USER_STOPPED, "the load generator stopped this user"
            )
            raise
        finally:
            timer.close()
            for deadline in (self.head_timer, self.first_timer):
                if deadline is not None:
                    deadline.close()

    # -- phases -------------------------------------------------------------------------

    def _exchange(self) -> None:
        if self.head_timer is not None:
            self.head_timer.start()
        if self.first_timer is not None:
            self.first_timer.start()
        self._connect_and_send()
        head, rest, t_arr = self._read_head()
        if self.head_timer is not None:
            self.head_timer.close()
        self._on_head(head)
        decoder = body_decoder(head)
        if head.status != 200:
            self._read_error(head, decoder, rest)
        else:
            self._read_stream(head, EventStream(decoder), rest, t_arr)

    def _connect_and_send(self) -> None:
        client = self.client
        try:
            self.conn, self.reused = client.acquire(self.request.connect_timeout_s, self.fresh)
        except OSError as exc:
            raise End(
                Outcome.ERROR,
                ClientCode.CONNECT_FAILED,
                f"cannot connect to {client.target.host}:{client.target.port}: {exc}",
            ) from exc
        self.conn.send(client.request_bytes(self.request))

    def _read_head(self) -> tuple[ResponseHead, bytes, float]:
        buf = b""
        while True:
            data, t_arr, _read_at = self._recv()
            if not data:
                if self.reused and not buf:
                    self._close()
                    raise Stale
                raise End(
                    Outcome.DISCONNECTED,
                    ClientCode.CONNECTION_CLOSED,
                    "closed before a response head",
                )
            buf += data
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                head, buf = parse_head(buf[:end]), buf[end + 4 :]
                if head.status >= 200:
                    return head, buf, t_arr
            elif len(buf) > MAX_HEAD_BYTES:
                raise ProtocolError(f"response head longer than {MAX_HEAD_BYTES} bytes")

    def _on_head(self, head: ResponseHead) -> None:
        result = self.result
        result.http_status = head.status
        headers = head.headers
        result.replica = headers.get("x-kvgate-replica") or headers.get("x-replica")
        retry_after = headers.get("retry-after")
        if retry_after is not None:
            try:
                result.retry_after_s = float(retry_after)
            except ValueError:
                result.retry_after_s = None  # an HTTP-date: no gate uses those

    def _read_error(self, head: ResponseHead, decoder: BodyDecoder, rest: bytes) -> None:
        body = self._read_body(decoder, rest)
        code, message = error_fields(body)
        status = head.status
        code = code or f"http_{status}"
        # A refusal status, or a reject code whatever the status: the server decided not to
        # serve this now.
        rejected = status in contract.RETRY_STATUSES or code in contract.REJECT_CODES
        if decoder.done and head.keep_alive:
            self._keep()
        self._end(Outcome.REJECTED if rejected else Outcome.ERROR, code, message)

    def _read_body(self, decoder: BodyDecoder, data: bytes) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            if data:
                piece = decoder.feed(data)
                parts.append(piece)
                size += len(piece)
                if decoder.done or size > MAX_ERROR_BODY_BYTES:
                    return b"".join(parts)
            data, _t, _read_at = self._recv()
            if not data:
                if isinstance(decoder, LengthDecoder) and decoder.until_close:
                    return b"".join(parts)
                raise End(
                    Outcome.DISCONNECTED,
                    ClientCode.CONNECTION_CLOSED,
                    "closed mid-way through a body",
                )

    def _read_stream(self, head: ResponseHead, events: EventStream, data: bytes, t: float) -> None:
        content_type = head.headers.get("content-type", "")
        if not content_type.startswith("text/event-stream"):
            raise ProtocolError(f"expected a text/event-stream response, got {content_type!r}")
        self.read_at = t
        done_at = self._consume(events, data, t, t) if data else None
        if done_at is None and self._connection.can_watch:
            done_at = self._stream_in_callback(events)
        while done_at is None:
            data, t, self.read_at = self._recv()
            done_at = self._consume(events, data, t, self.read_at)
        self._on_done(head, events, done_at)

    def _stream_in_callback(self, events: EventStream) -> float:
        """Handles every read in the event loop's callback and wakes this greenlet once, at
        the end of the stream (or with the exception that ended it)."""
        conn = self._connection
        waiter: Waiter[float] = Waiter()
        # Bound once: the callback runs once per token.
        recv_now, read_now, consume, result = (
            conn.recv_now,
            conn.read_now,
            self._consume,
            self.result,
        )
        clock = time.perf_counter

        def on_readable() -> None:
            try:
                if result.chunks:  # the first content has come: a read's own time counts
                    data = read_now()
                    if data is None:
                        return
                    t_arr = read_at = clock()
                else:
                    got = recv_now(True)
                    if got is None:
                        return
                    data, t_arr, read_at = got
                self.read_at = read_at
                result.bytes_received += len(data)
                done_at = consume(events, data, t_arr, read_at)
            except BaseException as exc:  # handed to the request's greenlet, which classifies
                conn.unwatch()
                waiter.throw(exc)
                return
            if done_at is not None:
                conn.unwatch()
                waiter.switch(done_at)

        conn.watch(on_readable)
        try:
            done_at: float = waiter.get()
        finally:
            conn.unwatch()
        return done_at

    def _consume(
        self, events: EventStream, data: bytes, t_arr: float, read_at: float
    ) -> float | None:
        """Handles one read; returns the time the read with `data: [DONE]` returned."""
        if not data:
            if events.until_close:
                self._ended_without_done()
            raise End(Outcome.DISCONNECTED, ClientCode.CONNECTION_CLOSED, "closed mid-stream")
        for event in events.feed(data):
            if self._on_event(event, t_arr):
                return read_at
        limit = self.request.cancel_after_chunks
        if limit is not None and self.result.chunks >= limit:
            raise self._cancel()
        if events.done:
            self._ended_without_done()
        return None

    # -- events -------------------------------------------------------------------------

    def _on_event(self, data: bytes, t_arr: float) -> bool:
        """Handles one SSE event; True at `data: [DONE]`. The per-token hot path: one call."""
        if data == b"[DONE]":
            return True
        chunk = json_object(data)
        result = self.result
        try:
            if "error" in chunk:
                code, message = error_object_fields(chunk["error"])
                raise End(Outcome.ERROR, code or ClientCode.STREAM_ERROR, message)
            content = None
            choices = chunk.get("choices")
            for choice in choices or ():
                delta = choice.get("delta")
                text = (
                    (delta.get("content") or delta.get("reasoning_content"))
                    if delta is not None
                    else choice.get("text")
                )
                if text:
                    content = text if content is None else content + text
                reason = choice.get("finish_reason")
                if reason:
                    result.finish_reason = reason
            if content is not None:
                self._on_content(content, t_arr, chunk)
            usage = chunk.get("usage")
            if usage:
                completion = usage.get("completion_tokens")
                result.prompt_tokens = usage.get("prompt_tokens")
                result.completion_tokens = completion
                details = usage.get("prompt_tokens_details") or {}
                result.cached_tokens = details.get("cached_tokens")
                if not result.chunks and completion and choices and self.client.continuous_usage:
                    # The first token came as "" content (partial UTF-8): the count says it
                    # arrived. The usage-only chunk at the end (no choices) never counts.
                    self._on_content("", t_arr, chunk)
        except (AttributeError, TypeError, KeyError) as exc:
            raise ProtocolError(f"unexpected chunk shape: {data[:120]!r}") from exc
        return False

    def _on_content(self, text: str, t_arr: float, chunk: dict[str, Any]) -> None:
        result = self.result
        if result.chunks:
            if t_arr < self.read_at:
                t_arr = self.read_at
            result.gaps.append(t_arr - self.last_t)
            self.last_t = t_arr
        else:
            if self.first_timer is not None:
                self.first_timer.close()
            result.ttft_s = t_arr - self.t0
            result.ttft_read_s = self.read_at - self.t0
            result.first_emit_ts = chunk.get("kvgate_emit_ts")
            # Gaps are measured between the times reads returned, like for like; content
            # that came in the same read as the first has a gap of zero.
            self.last_t = self.read_at
        result.chunks += 1
        if result.text is not None and text:
            result.text.append(text)

    # -- endings ------------------------------------------------------------------------

    def _on_done(self, head: ResponseHead, events: EventStream, t_arr: float) -> None:
        result = self.result
        result.outcome, result.error_code, result.error_message = self._answer()
        result.e2e_s = t_arr - self.t0
        self.settling = True
        conn, self.conn = self._connection, None
        self.client.settle(conn, events, head.keep_alive)

    def _ended_without_done(self) -> None:
        if self.result.finish_reason is not None:
            raise End(*self._answer())
        raise ProtocolError("the stream ended without `data: [DONE]` or a finish_reason")

    def _answer(self) -> tuple[Outcome, str | None, str | None]:
        """How a stream that ended cleanly ended: ok, unless not one content chunk came
        although the request asked for output. The server then said it answered and
        served nothing, whatever its finish_reason: a failure, with no first token."""
        result = self.result
        if result.chunks or not self.request.expects_content:
            return Outcome.OK, None, None
        message = (
            "the stream ended cleanly without one content chunk "
            f"(finish_reason {result.finish_reason}, completion_tokens {result.completion_tokens})"
        )
        return Outcome.ERROR, ClientCode.EMPTY_STREAM, message

    def _cancel(self) -> End:
        """Closes the connection on purpose: the server must see the client go away."""
        self.result.cancel_at = time.time()
        self._close()
        return End(Outcome.CANCELLED)

    def _on_timer(self) -> None:
        if self.settling:  # fired while settling the connection: the ending is already judged
            self._close()
            return
        if self.cancel_t <= self.deadline:  # the timer was armed for the cancel, not a timeout
            self._end(self._cancel().outcome)
            return
        self._end(
            Outcome.TIMEOUT,
            ClientCode.CLIENT_TIMEOUT,
            f"no ending within {self.request.timeout_s:g} s",
        )

    def _head_timeout_message(self) -> str:
        return f"no response head within {self.request.head_timeout_s:g} s (head_timeout_s)"

    def _end(self, outcome: Outcome, code: str | None = None, message: str | None = None) -> None:
        result = self.result
        result.outcome = outcome
        result.error_code = code
        result.error_message = message
        result.e2e_s = time.perf_counter() - self.t0
        self._close()

    # -- socket helpers -----------------------------------------------------------------

    @property
    def _connection(self) -> Connection:
        assert self.conn is not None, "an exchange reads only after it connected"
        return self.conn

    def _recv(self) -> tuple[bytes, float, float]:
        """Reads on: `(data, arrival, read_at)`. Until the first content arrives, `arrival`
        is the kernel's stamp where there is one (TTFT); later reads use the time they
        returned (gaps, end-to-end: what the user's code sees)."""
        got = self._connection.recv(not self.result.chunks)
        self.result.bytes_received += len(got[0])
        return got

    def _keep(self) -> None:
        if self.conn is not None:
            self.client.release(self.conn)
            self.conn = None

    def _close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
