"""Incremental HTTP/1.1 response framing and text/event-stream parsing, bytes in, no sockets.

Each parser keeps only the unfinished tail of what it was fed, so a caller can hand it
whatever a single `recv` returned and get every complete unit out at once. Anything that
does not follow the wire format raises `ProtocolError` with the offending bytes quoted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

MAX_HEAD_BYTES = 64 * 1024
MAX_LINE_BYTES = 1024 * 1024
_HEX_DIGITS = b"0123456789abcdefABCDEF"
_SSE_IGNORED_FIELDS = (b"event", b"id", b"retry")


class ProtocolError(Exception):
    """The peer broke HTTP/1.1 framing, SSE syntax or the OpenAI chunk format."""


@dataclass(slots=True)
class ResponseHead:
    """Status line and headers of one response; header names are lower-cased."""

    status: int
    reason: str
    headers: dict[str, str]

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    @property
    def content_length(self) -> int | None:
        raw = self.headers.get("content-length")
        if raw is None:
            return None
        if not raw.strip().isdigit():
            raise ProtocolError(f"Content-Length is not a number: {raw!r}")
        return int(raw)

    @property
    def keep_alive(self) -> bool:
        return "close" not in self.headers.get("connection", "").lower()


def parse_head(raw: bytes) -> ResponseHead:
    """Parses a response head (everything before the blank line, without it)."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"malformed response header line: {line[:80]!r}")
        headers[name.lower()] = value.strip()
    return ResponseHead(int(parts[1]), parts[2] if len(parts) > 2 else "", headers)


class ChunkedDecoder:
    """Decodes a `Transfer-Encoding: chunked` body fed in arbitrary pieces.

    Invariant: `_pending` holds only bytes of an incomplete chunk-size line or CRLF; chunk
    data is passed through as soon as it arrives (an SSE event must not wait for the rest).
    """

    __slots__ = ("_in_trailer", "_left", "_need_crlf", "_pending", "done")

    def __init__(self) -> None:
        self._pending = b""
        self._left = 0
        self._need_crlf = False
        self._in_trailer = False
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buf = self._pending + data if self._pending else data
        out: list[bytes] = []
        i, n = 0, len(buf)
        while i < n and not self.done:
            if self._left:
                take = min(self._left, n - i)
                out.append(buf[i : i + take])
                i += take
                self._left -= take
                self._need_crlf = self._left == 0
                continue
            if self._need_crlf:
                if n - i < 2:
                    break
                if buf[i : i + 2] != b"\r\n":
                    raise ProtocolError(f"chunk data not followed by CRLF: {buf[i : i + 16]!r}")
                i += 2
                self._need_crlf = False
                continue
            end = buf.find(b"\r\n", i)
            if end < 0:
                if n - i > 1024:
                    raise ProtocolError(f"chunk-size line too long: {buf[i : i + 40]!r}")
                break
            line, i = buf[i:end], end + 2
            if self._in_trailer:
                self.done = not line
                continue
            self._start_chunk(line)
        self._pending = buf[i:] if not self.done else b""
        return out[0] if len(out) == 1 else b"".join(out)

    @property
    def at_boundary(self) -> bool:
        """Between chunks, nothing held back: the next byte starts a chunk-size line."""
        return not (self._pending or self._left or self._need_crlf or self._in_trailer)

    def _start_chunk(self, line: bytes) -> None:
        size_field = line.split(b";", 1)[0].strip()
        if not size_field or size_field.strip(_HEX_DIGITS):
            raise ProtocolError(f"bad chunk-size line: {line[:40]!r}")
        size = int(size_field, 16)
        if size == 0:
            self._in_trailer = True
        else:
            self._left = size


class LengthDecoder:
    """A body of known length (`Content-Length`), or one that runs until the peer closes."""

    __slots__ = ("_left", "done")

    def __init__(self, length: int | None) -> None:
        self._left = length
        self.done = length == 0

    def feed(self, data: bytes) -> bytes:
        if self._left is None:
            return data
        data = data[: self._left]
        self._left -= len(data)
        self.done = self._left == 0
        return data

    @property
    def until_close(self) -> bool:
        return self._left is None


BodyDecoder = ChunkedDecoder | LengthDecoder


def body_decoder(head: ResponseHead) -> BodyDecoder:
    if head.chunked:
        return ChunkedDecoder()
    return LengthDecoder(head.content_length)


class SSEParser:
    """Splits a text/event-stream into the `data` payloads of its events.

    Accepts LF, CRLF and CR line endings, comments and the standard fields; any other line is
    a protocol error (an inference server has no reason to send one). Invariant: `_tail` holds
    the bytes after the last complete line, `_data` the data lines of the event in progress.
    """

    __slots__ = ("_data", "_skip_lf", "_tail")

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[bytes] = []
        self._skip_lf = False

    @property
    def idle(self) -> bool:
        """Between events, nothing held back."""
        return not (self._tail or self._data or self._skip_lf)

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._skip_lf:
            # The previous piece ended in CR, already taken as a line end: drop its LF half.
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._tail + chunk if self._tail else chunk
        if b"\r" in buf:
            self._skip_lf = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > MAX_LINE_BYTES:
            raise ProtocolError(f"SSE line longer than {MAX_LINE_BYTES} bytes")
        events: list[bytes] = []
        for line in lines:
            if not line:
                if self._data:
                    data = self._data
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    self._data = []
            elif line.startswith(b"data:"):
                self._data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line[0] != 0x3A and line.split(b":", 1)[0] not in _SSE_IGNORED_FIELDS:
                raise ProtocolError(f"not an SSE line: {line[:80]!r}")
        return events


class EventStream:
    """The SSE events of a response body, whatever its framing.

    Servers write one HTTP chunk holding one `data:` event per token; when a read is exactly
    that and both parsers are between units (`_fast`), the event is cut out directly (the
    general path gives the same result, several times slower).
    """

    __slots__ = ("_body", "_chunked", "_fast", "_sse")

    def __init__(self, body: BodyDecoder) -> None:
        self._body = body
        self._chunked = body if isinstance(body, ChunkedDecoder) else None
        self._sse = SSEParser()
        self._fast = self._chunked is not None

    @property
    def done(self) -> bool:
        return self._body.done

    @property
    def until_close(self) -> bool:
        return isinstance(self._body, LengthDecoder) and self._body.until_close

    def feed(self, data: bytes) -> list[bytes]:
        if self._fast:
            event = _single_event(data)
            if event is not None:
                return [event]
        payload = self._body.feed(data)
        events = self._sse.feed(payload) if payload else []
        chunked = self._chunked
        self._fast = chunked is not None and chunked.at_boundary and self._sse.idle
        return events


def _single_event(data: bytes) -> bytes | None:
    """The event's data if `data` is exactly one chunk of exactly one one-line event."""
    end = data.find(b"\r\n", 0, 10)
    # startswith/endswith at an offset: no slice is copied to compare (this runs per token)
    if end <= 0 or not data.startswith(b"data: ", end + 2) or not data.endswith(b"\n\n\r\n"):
        return None
    size_field = data[:end]
    if size_field.strip(_HEX_DIGITS) or len(data) != end + int(size_field, 16) + 4:
        return None
    event = data[end + 8 : -4]
    if b"\n" in event or b"\r" in event:
        return None
    return event


def error_fields(body: bytes) -> tuple[str | None, str]:
    """(code, message) of an OpenAI error body; (None, the text) for anything else."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None, body[:300].decode("utf-8", "replace")
    if isinstance(parsed, dict) and "error" in parsed:
        return error_object_fields(parsed["error"])
    return None, body[:300].decode("utf-8", "replace")


def error_object_fields(error: Any) -> tuple[str | None, str]:
    """(code, message) of the object under an OpenAI error's "error" key."""
    if isinstance(error, dict):
        code = error.get("code")
        return (str(code) if code is not None else None), str(error.get("message", ""))
    return None, str(error)


def json_object(data: bytes) -> dict[str, Any]:
    """Parses one chunk's JSON: orjson first (straight from bytes, a few times faster than
    the standard library's decoder, and this runs once per token); anything orjson refuses
    is read again by the standard library, so what is accepted (NaN, integers beyond 64 bits)
    and what is refused are exactly the standard library's."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            obj = json.loads(data)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both derive from it
            raise ProtocolError(f"SSE data is not JSON: {data[:80]!r}") from exc
    if not isinstance(obj, dict):
        raise ProtocolError(f"SSE data is not a JSON object: {data[:80]!r}")
    return obj
