"""Pre-encoded chunks are valid OpenAI stream JSON, framed as HTTP/1.1 chunks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from server.replica.streams import Stream, StreamSpec, natural_length
from server.scheduler import Priority
from server.tokenizer import TextTokenizer


class FakeTransport(asyncio.Transport):
    """Keeps what is written; `closing` stands for a client that went away."""

    def __init__(self) -> None:
        super().__init__()
        self.data = b""
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0


def _spec(
    kind: str, stream: bool = True, include_usage: bool = True, ignore_eos: bool = True
) -> StreamSpec:
    return StreamSpec(
        request_id='id"1',
        tenant="acme",
        priority=Priority.INTERACTIVE,
        kind=kind,
        model="llama-3-8b",
        stream=stream,
        include_usage=include_usage,
        debug_timing=False,
        prompt_tokens=7,
        ignore_eos=ignore_eos,
    )


def _unframe(raw: bytes) -> list[dict[str, Any]]:
    events, rest = [], raw
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        body, rest = rest[:n], rest[n + 2 :]
        for line in body.split(b"\n\n"):
            if line.startswith(b"data: {"):
                events.append(json.loads(line[6:]))
            elif line:
                assert line == b"data: [DONE]"
    return events


def _run(kind: str, **kw: bool) -> tuple[Stream, list[dict[str, Any]]]:
    async def go() -> tuple[Stream, list[dict[str, Any]]]:
        words = TextTokenizer().output_json
        s = Stream(_spec(kind, **kw), words)
        s.set_budget(max_new=3, cached_tokens=2)
        t = FakeTransport()
        s.emit(b"}")  # before the handler attached: buffered, not lost
        s.attach(t)
        for _ in range(2):
            assert s.emit(b',"kvgate_emit_ts":1.5}') is None
        s.finish(2.0)
        return s, _unframe(t.data)

    return asyncio.run(go())


def test_chat_chunks_usage_and_done() -> None:
    s, events = _run("chat")
    assert [e["object"] for e in events] == ["chat.completion.chunk"] * 5
    assert events[0]["id"] == 'chatcmpl-id"1'
    content = [e["choices"][0]["delta"]["content"] for e in events[:3]]
    assert all(c.startswith(" ") for c in content)
    assert "kvgate_emit_ts" not in events[0] and events[1]["kvgate_emit_ts"] == 1.5
    assert events[3]["choices"][0]["finish_reason"] == "length"
    assert events[4]["choices"] == []
    assert events[4]["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    assert s.emitted == 3 and s.texts == []  # streamed text is not also kept in memory


def test_non_streaming_body() -> None:
    s, events = _run("chat", stream=False)
    assert events == []
    body = s.response_body()
    choices, usage = body["choices"], body["usage"]
    assert isinstance(choices, list) and isinstance(usage, dict)
    assert choices[0]["finish_reason"] == "length"
    assert len(choices[0]["message"]["content"].split()) == 3
    assert usage["completion_tokens"] == 3


def test_completion_chunks_and_natural_stop() -> None:
    _, events = _run("completion", include_usage=False, ignore_eos=False)
    assert [e["object"] for e in events] == ["text_completion"] * 4
    assert all(isinstance(e["choices"][0]["text"], str) for e in events)
    assert 16 <= natural_length("abc") <= 512 and natural_length("abc") == natural_length("abc")


def test_closed_transport_asks_for_cancel() -> None:
    async def go() -> str | None:
        s = Stream(_spec("chat"), TextTokenizer().output_json)
        s.set_budget(max_new=5, cached_tokens=0)
        t = FakeTransport()
        s.attach(t)
        t.closing = True
        return s.emit(b"}")

    assert asyncio.run(go()) == "client_disconnect"
