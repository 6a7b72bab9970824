"""One in-flight request on a replica and the bytes it sends.

Chunk templates are encoded once per request, so emitting a token is two byte
concatenations and one `transport.write`: the step loop writes every stream's chunk itself,
with no task or future per token. HTTP/1.1 chunked framing is done here because the loop
writes to the transport directly (aiohttp's writer is used only for headers and the end).
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from dataclasses import dataclass

from server.protocol import ApiError
from server.scheduler import Priority

# A client whose socket buffer holds more than this is not reading; it is cancelled rather
# than allowed to grow the replica's memory.
MAX_WRITE_BUFFER = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """Everything fixed about a request once it has been parsed and authenticated."""

    request_id: str  # the scheduler's key: the client's id scoped by tenant
    tenant: str
    priority: Priority
    kind: str  # "chat" | "completion"
    model: str
    stream: bool
    include_usage: bool
    debug_timing: bool
    prompt_tokens: int
    ignore_eos: bool
    client_id: str = ""  # the client's X-Request-Id (the output's ids); "" = request_id
    continuous_usage: bool = False  # vLLM's continuous_usage_stats: usage on every chunk
    min_tokens: int = 0

    @property
    def public_id(self) -> str:
        return self.client_id or self.request_id


def natural_length(request_id: str) -> int:
    """The output length the sim picks when EOS is honoured: 16..512, fixed by the id."""
    return 16 + zlib.crc32(request_id.encode()) % 497


def frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class Stream:
    """A request between submit and its end. Invariant: once `closed`, nothing more is written
    and the scheduler no longer holds it; `emitted` only grows, up to `target`."""

    __slots__ = (
        "_done",
        "_head",
        "_pending",
        "_seed",
        "_tail",
        "_words",
        "aborted",
        "admitted",
        "cached_tokens",
        "closed",
        "created",
        "emitted",
        "finish_reason",
        "max_new",
        "spec",
        "target",
        "texts",
        "transport",
    )

    def __init__(self, spec: StreamSpec, words: tuple[bytes, ...]) -> None:
        self.spec = spec
        self.created = int(time.time())
        self._words = words
        self._seed = zlib.crc32(spec.public_id.encode())
        self.emitted = 0
        self.max_new = 0
        self.target = 0
        self.cached_tokens = 0
        self.finish_reason = "length"
        self.closed = False
        self.aborted = False
        self.transport: asyncio.Transport | None = None
        self._pending: list[bytes] = []
        self.texts: list[bytes] = []
        loop = asyncio.get_running_loop()
        self.admitted: asyncio.Future[None] = loop.create_future()
        self._done: asyncio.Future[None] = loop.create_future()
        rid = json.dumps(spec.public_id)[1:-1]
        model = json.dumps(spec.model)[1:-1]
        if spec.kind == "chat":
            self._head = (
                f'data: {{"id":"chatcmpl-{rid}","object":"chat.completion.chunk",'
                f'"created":{self.created},"model":"{model}","choices":[{{"index":0,'
                f'"delta":{{"content":"'
            ).encode()
            self._tail = b'"},"logprobs":null,"finish_reason":null}]'
        else:
            self._head = (
                f'data: {{"id":"cmpl-{rid}","object":"text_completion","created":'
                f'{self.created},"model":"{model}","choices":[{{"index":0,"text":"'
            ).encode()
            self._tail = b'","logprobs":null,"finish_reason":null}]'

    def set_budget(self, max_new: int, cached_tokens: int) -> None:
        self.max_new = max_new
        self.cached_tokens = cached_tokens
        natural = max(natural_length(self.spec.public_id), self.spec.min_tokens)
        self.target = max_new if self.spec.ignore_eos else min(natural, max_new)
        self.finish_reason = "length" if self.target == max_new else "stop"

    @property
    def context_tokens(self) -> int:
        return self.spec.prompt_tokens + self.emitted

    @property
    def reserved_tokens(self) -> int:
        """Input plus output still allowed: constant for the request's life (the ledger unit)."""
        return self.spec.prompt_tokens + self.max_new

    # -- writing --------------------------------------------------------------------------

    def attach(self, transport: asyncio.Transport | None) -> None:
        """The handler has sent headers (and the role chunk): flush what the loop buffered."""
        self.transport = transport
        if self._pending and transport is not None and not transport.is_closing():
            transport.write(b"".join(self._pending))
        self._pending.clear()

    def _write(self, data: bytes) -> str | None:
        """Write framed bytes; a cancel reason when the client is gone or not reading."""
        transport = self.transport
        if transport is None:
            self._pending.append(data)
            return None
        if transport.is_closing():
            return "client_disconnect"
        if transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
            return "slow_client"
        transport.write(data)
        return None

    def emit(self, stamp: bytes) -> str | None:
        """Produce the next token; `stamp` closes the JSON (`}` or the debug-timing field).
        Returns None, or why the request must be cancelled instead."""
        word = self._words[(self._seed + self.emitted * 7) % len(self._words)]
        self.emitted += 1
        if not self.spec.stream:
            self.texts.append(word)
            return None
        tail = self._tail + self._usage_field() if self.spec.continuous_usage else self._tail
        payload = self._head + word + tail + stamp
        return self._write(b"%x\r\n%s\n\n\r\n" % (len(payload) + 2, payload))

    def role_chunk(self) -> bytes:
        """The first SSE event of a chat stream: role only, no content (as OpenAI sends)."""
        obj = self._chunk_obj([{"index": 0, "delta": {"role": "assistant", "content": ""}}])
        if self.spec.continuous_usage:
            obj["usage"] = self.usage(cached=False)
        return sse(obj)

    def closing_events(self, t: float) -> bytes:
        """finish_reason chunk, optional usage chunk (choices: []), then [DONE]."""
        if self.spec.kind == "chat":
            last = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": self.finish_reason}
        else:
            last = {"index": 0, "text": "", "logprobs": None, "finish_reason": self.finish_reason}
        finish = self._chunk_obj([last], t)
        if self.spec.continuous_usage:
            finish["usage"] = self.usage(cached=False)
        out = [sse(finish)]
        if self.spec.include_usage:
            usage = self._chunk_obj([], t)
            usage["usage"] = self.usage()
            out.append(sse(usage))
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)

    def _chunk_obj(
        self, choices: list[dict[str, object]], t: float | None = None
    ) -> dict[str, object]:
        chat = self.spec.kind == "chat"
        obj: dict[str, object] = {
            "id": ("chatcmpl-" if chat else "cmpl-") + self.spec.public_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self.created,
            "model": self.spec.model,
            "choices": choices,
        }
        if self.spec.debug_timing:
            obj["kvgate_emit_ts"] = t if t is not None else time.time()
        return obj

    def usage(self, cached: bool = True) -> dict[str, object]:
        out: dict[str, object] = {
            "prompt_tokens": self.spec.prompt_tokens,
            "completion_tokens": self.emitted,
            "total_tokens": self.spec.prompt_tokens + self.emitted,
        }
        if cached:
            out["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return out

    def _usage_field(self) -> bytes:
        """`,"usage":{...}` for a token chunk: the counts so far, as vLLM sends them."""
        p, n = self.spec.prompt_tokens, self.emitted
        return b',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (
            p,
            n,
            p + n,
        )

    def response_body(self) -> dict[str, object]:
        """The non-streaming answer."""
        text = b"".join(self.texts).decode()
        chat = self.spec.kind == "chat"
        if chat:
            choice: dict[str, object] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": self.finish_reason,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": self.finish_reason,
            }
        return {
            "id": ("chatcmpl-" if chat else "cmpl-") + self.spec.public_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": self.created,
            "model": self.spec.model,
            "choices": [choice],
            "usage": self.usage(),
        }

    # -- lifecycle ------------------------------------------------------------------------

    def finish(self, t: float) -> None:
        """Generation ended normally: write the closing events and wake the handler."""
        if self.closed:
            return
        if self.spec.stream:
            self._write(frame(self.closing_events(t)))
        self.closed = True
        if not self._done.done():
            self._done.set_result(None)

    def abort(self) -> None:
        """The client went away or the request was dropped: stop writing, wake the handler."""
        self.closed = True
        self.aborted = True
        if not self._done.done():
            self._done.set_result(None)
        if not self.admitted.done():
            self.admitted.set_result(None)

    def reject(self, error: ApiError) -> None:
        """A queued request was rejected (deadline): the handler answers with `error`."""
        self.closed = True
        if not self.admitted.done():
            self.admitted.set_exception(error)

    async def wait_done(self) -> None:
        await self._done


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
