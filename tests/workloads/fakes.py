"""A scripted fake OpenAI streaming server (gevent, in-process) for the client's edge cases.

The `X-Fake` request header picks the script; the server records every request id it saw.
Scripts cover well-formed streams and each way a real server can misbehave. A script that
stalls stalls for STALL_S, longer than any client deadline in the tests, so a client that
waits on it ends in a timeout, never in the outcome the test expects.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import gevent
from gevent.event import Event
from gevent.pool import Pool
from gevent.server import StreamServer
from gevent.socket import IPPROTO_TCP, TCP_NODELAY
from gevent.socket import socket as GSocket

ROLE_CHUNK = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}


def content_chunk(text: str, finish: str | None = None) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def usage_chunk(prompt: int, completion: int, cached: int) -> dict[str, object]:
    return {
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


STALL_S = 120.0

STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"X-Kvgate-Replica: fake0\r\n\r\n"
)


class FakeServer:
    """Serves scripted responses on 127.0.0.1; `seen` lists X-Request-Id values in order and
    `requests` the (lower-cased headers, body) of each request."""

    def __init__(self, tokens: int = 5, gap_s: float = 0.0) -> None:
        self.tokens = tokens
        self.gap_s = gap_s
        self.seen: list[str] = []
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.connections = 0
        # Set by a test to let `late_end` send the end of its body; cleared as it is used.
        self.end_body = Event()
        # A pool, so that stopping the server also ends handlers still stalling.
        self._server = StreamServer(("127.0.0.1", 0), self._handle, spawn=Pool())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop(timeout=0)

    def _handle(self, sock: GSocket, _addr: object) -> None:
        self.connections += 1
        sock.setsockopt(IPPROTO_TCP, TCP_NODELAY, 1)  # as real servers do: no Nagle delays
        buf = b""
        try:
            while True:
                head, buf = _read_until(sock, buf, b"\r\n\r\n")
                if head is None:
                    return
                headers = _headers(head)
                length = int(headers.get("content-length", "0"))
                while len(buf) < length:
                    more = sock.recv(65536)
                    if not more:
                        return
                    buf += more
                body, buf = buf[:length], buf[length:]
                self.seen.append(headers.get("x-request-id", ""))
                self.requests.append((headers, body))
                script = SCRIPTS[headers.get("x-fake", "ok")]
                if not script(self, sock):
                    return
        except OSError:
            return
        finally:
            sock.close()

    # -- scripts: each writes one response; True keeps the connection for the next ----------

    def ok(self, sock: GSocket) -> bool:
        sock.sendall(STREAM_HEAD + chunk(sse(ROLE_CHUNK)))
        for i in range(self.tokens):
            if self.gap_s:
                gevent.sleep(self.gap_s)
            text = " two words" if i == 1 else " word"
            finish = "length" if i == self.tokens - 1 else None
            sock.sendall(chunk(sse(content_chunk(text, finish))))
        sock.sendall(chunk(sse(usage_chunk(40, self.tokens + 1, 16)) + b"data: [DONE]\n\n"))
        sock.sendall(b"0\r\n\r\n")
        return True

    def empty(self, sock: GSocket) -> bool:
        # A clean stream with nothing in it: the role chunk, a finish, usage and [DONE].
        sock.sendall(STREAM_HEAD + chunk(sse(ROLE_CHUNK)))
        sock.sendall(chunk(sse(content_chunk("", "stop")) + sse(usage_chunk(40, 0, 0))))
        sock.sendall(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True

    def ok_then_close(self, sock: GSocket) -> bool:
        self.ok(sock)
        return False  # as servers do when an idle keep-alive connection times out

    def late_end(self, sock: GSocket) -> bool:
        sock.sendall(STREAM_HEAD + chunk(sse(content_chunk(" hi", "stop"))))
        sock.sendall(chunk(b"data: [DONE]\n\n"))
        # The body's end comes later, as from aiohttp handlers: once the test says so.
        self.end_body.wait(STALL_S)
        self.end_body.clear()
        sock.sendall(b"0\r\n\r\n")
        return True

    def keep_open(self, sock: GSocket) -> bool:
        sock.sendall(STREAM_HEAD + chunk(sse(content_chunk(" hi", "stop"))))
        sock.sendall(chunk(b"data: [DONE]\n\n"))
        gevent.sleep(STALL_S)  # never ends the body: the client must not wait for it
        return False

    def crlf_bytewise(self, sock: GSocket) -> bool:
        sock.sendall(STREAM_HEAD)
        body = b"".join(
            chunk(sse(obj).replace(b"\n", b"\r\n"))
            for obj in (ROLE_CHUNK, content_chunk(" a"), content_chunk(" b", "stop"))
        )
        body += chunk(b": keep-alive comment\r\n\r\ndata: [DONE]\r\n\r\n") + b"0\r\n\r\n"
        for i in range(len(body)):
            sock.sendall(body[i : i + 1])
        return True

    def malformed_json(self, sock: GSocket) -> bool:
        sock.sendall(STREAM_HEAD + chunk(b'data: {"choices": [\n\n'))
        gevent.sleep(STALL_S)  # the client must judge the bytes, not wait for the close
        return False

    def malformed_sse(self, sock: GSocket) -> bool:
        sock.sendall(STREAM_HEAD + chunk(b"this is not an event stream\n\n"))
        gevent.sleep(STALL_S)  # the client must judge the bytes, not wait for the close
        return False

    def drop(self, sock: GSocket) -> bool:
        sock.sendall(
            STREAM_HEAD + chunk(sse(content_chunk(" hi"))) + chunk(sse(content_chunk(" x")))
        )
        return False

    def reject(self, sock: GSocket) -> bool:
        body = json.dumps(
            {
                "error": {
                    "message": "tenant over quota",
                    "type": "rate_limit",
                    "code": "tenant_quota",
                }
            }
        ).encode()
        sock.sendall(
            b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
            + f"Retry-After: 3\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        return True

    def server_error(self, sock: GSocket) -> bool:
        body = b"upstream exploded"
        sock.sendall(
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        return True

    def stream_error(self, sock: GSocket) -> bool:
        error = {
            "error": {"message": "replica died", "type": "server_error", "code": "replica_failed"}
        }
        sock.sendall(STREAM_HEAD + chunk(sse(content_chunk(" hi")) + sse(error)))
        sock.sendall(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True

    def stall(self, sock: GSocket) -> bool:
        gevent.sleep(STALL_S)  # never answers: the client's deadline must end the request
        return False

    def slow_tokens(self, sock: GSocket) -> bool:
        # A token every 10 ms (paced on purpose) that never finishes: only the client's
        # cancel, deadline or death ends it, and the next write then fails.
        sock.sendall(STREAM_HEAD + chunk(sse(ROLE_CHUNK)))
        deadline = time.monotonic() + STALL_S
        while time.monotonic() < deadline:
            gevent.sleep(0.01)
            sock.sendall(chunk(sse(content_chunk(" tick"))))
        return False

    def stall_mid_stream(self, sock: GSocket) -> bool:
        sock.sendall(STREAM_HEAD + chunk(sse(ROLE_CHUNK)))
        sock.sendall(b"".join(chunk(sse(content_chunk(" tok"))) for _ in range(3)))
        gevent.sleep(STALL_S)  # three tokens, then nothing: the client's deadline must end it
        return False

    def queued(self, sock: GSocket) -> bool:
        # As vLLM streams a request it has queued: the head and a role-only chunk at once,
        # then nothing until the request is scheduled (here: never).
        sock.sendall(STREAM_HEAD + chunk(sse(ROLE_CHUNK)))
        gevent.sleep(STALL_S)
        return False

    def until_close(self, sock: GSocket) -> bool:
        sock.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
            + sse(content_chunk(" hi", "stop"))
            + b"data: [DONE]\n\n"
        )
        return False


SCRIPTS: dict[str, Callable[[FakeServer, GSocket], bool]] = {
    name: getattr(FakeServer, name)
    for name in (
        "ok",
        "empty",
        "ok_then_close",
        "late_end",
        "keep_open",
        "crlf_bytewise",
        "malformed_json",
        "malformed_sse",
        "drop",
        "reject",
        "server_error",
        "stream_error",
        "stall",
        "slow_tokens",
        "stall_mid_stream",
        "queued",
        "until_close",
    )
}


def _read_until(sock: GSocket, buf: bytes, marker: bytes) -> tuple[bytes | None, bytes]:
    deadline = time.monotonic() + 30
    while marker not in buf:
        if time.monotonic() > deadline:
            return None, buf
        more = sock.recv(65536)
        if not more:
            return None, buf
        buf += more
    head, _, rest = buf.partition(marker)
    return head, rest


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}


@contextmanager
def fake_server(tokens: int = 5, gap_s: float = 0.0) -> Iterator[FakeServer]:
    server = FakeServer(tokens, gap_s)
    server.start()
    try:
        yield server
    finally:
        server.stop()
