"""The incremental HTTP/SSE parsers: any split of the bytes gives the same events."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads.wire import (
    ChunkedDecoder,
    EventStream,
    LengthDecoder,
    ProtocolError,
    SSEParser,
    json_object,
    parse_head,
)

EVENTS = [b'{"a": 1}', b'{"b": "x y"}', b"[DONE]"]


def chunked(payload: bytes, sizes: list[int]) -> bytes:
    out, i = b"", 0
    for size in sizes:
        piece = payload[i : i + size]
        if not piece:
            break
        out += f"{len(piece):x};ext=1\r\n".encode() + piece + b"\r\n"
        i += len(piece)
    if i < len(payload):
        rest = payload[i:]
        out += f"{len(rest):x}\r\n".encode() + rest + b"\r\n"
    return out + b"0\r\nTrailer: x\r\n\r\n"


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces


# No deadline or speed check: how long an example takes depends on the machine, not the parser.
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 40), max_size=8),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
    newline=st.sampled_from([b"\n", b"\r\n", b"\r"]),
)
def test_chunked_sse_any_split_gives_the_same_events(
    sizes: list[int], cuts: list[int], newline: bytes
) -> None:
    stream = b"".join(b"data: " + e + newline + newline for e in EVENTS)
    stream = b": comment" + newline + b"event: message" + newline + stream
    wire = chunked(stream, sizes)
    decoder, parser, events = ChunkedDecoder(), SSEParser(), []
    for piece in split(wire, cuts):
        events.extend(parser.feed(decoder.feed(piece)))
    assert events == EVENTS
    assert decoder.done
    fast, fast_events = EventStream(ChunkedDecoder()), []
    for piece in split(wire, cuts):
        fast_events.extend(fast.feed(piece))
    assert fast_events == EVENTS and fast.done


def one_chunk(event: bytes) -> bytes:
    payload = b"data: " + event + b"\n\n"
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


@pytest.mark.parametrize(
    "wire",
    [
        one_chunk(b'{"a": 1}') * 3,  # several chunks in one read
        one_chunk(b"x\ndata: y"),  # a two-line event
        one_chunk(b'{"a": 1}')[:-1],  # a chunk cut short
        b"C;ext=1\r\ndata: 1234\n\n\r\n",  # a chunk extension
        one_chunk(b"") + one_chunk(b"[DONE]") + b"0\r\n\r\n",
    ],
)
def test_event_stream_fast_path_agrees_with_the_general_parsers(wire: bytes) -> None:
    general = SSEParser().feed(ChunkedDecoder().feed(wire))
    assert EventStream(ChunkedDecoder()).feed(wire) == general


def test_json_object_accepts_objects_only() -> None:
    assert json_object(b' {"a": [1, 2]} ') == {"a": [1, 2]}
    for bad in (b'{"a": 1} x', b"[1, 2]", b"\xff", b'{"a":', b"", b'"text"'):
        with pytest.raises(ProtocolError):
            json_object(bad)


def test_json_object_reads_what_the_standard_library_reads() -> None:
    # NaN and integers past 64 bits: outside strict JSON, yet servers send them and the
    # standard library takes them; a chunk that carries one is not a protocol error.
    assert json_object(b'{"logprob": NaN, "n": 123456789012345678901234567890}') == {
        "logprob": pytest.approx(float("nan"), nan_ok=True),
        "n": 123456789012345678901234567890,
    }
    # A JSON escape and the same letter as UTF-8 in one chunk.
    chunk = '{"choices":[{"delta":{"content":"\\u00e9t\u00e9"}}],"ts":1.5}'.encode()
    assert json_object(chunk) == json.loads(chunk)


def test_multiline_data_is_joined_with_newlines() -> None:
    assert SSEParser().feed(b"data: one\ndata:two\n\n") == [b"one\ntwo"]


def test_unknown_sse_line_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="not an SSE line"):
        SSEParser().feed(b"garbage here\n\n")


@pytest.mark.parametrize(
    "wire",
    [b"zz\r\nabc\r\n", b"3\r\nabcXY", b"-1\r\n", b"0x3\r\nabc\r\n"],
)
def test_bad_chunk_framing_is_a_protocol_error(wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        ChunkedDecoder().feed(wire)


def test_length_decoder_stops_at_content_length_and_until_close_never_ends() -> None:
    fixed = LengthDecoder(5)
    assert fixed.feed(b"abc") == b"abc"
    assert fixed.feed(b"defgh") == b"de"
    assert fixed.done
    open_ended = LengthDecoder(None)
    assert open_ended.feed(b"abc") == b"abc"
    assert open_ended.until_close and not open_ended.done


def test_parse_head_reads_status_and_lowercases_header_names() -> None:
    head = parse_head(b"HTTP/1.1 429 Too Many\r\nRetry-After: 2\r\nTransfer-Encoding: chunked")
    assert (head.status, head.reason) == (429, "Too Many")
    assert head.headers["retry-after"] == "2"
    assert head.chunked and head.keep_alive


@pytest.mark.parametrize("raw", [b"HTTP/2 200 OK", b"garbage", b"HTTP/1.1 200 OK\r\nbad line"])
def test_parse_head_rejects_malformed_heads(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_head(raw)
