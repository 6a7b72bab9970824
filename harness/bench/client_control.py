"""A control SSE server for `kvgate bench client` that stamps every chunk as it writes it.

`python -m harness.bench.client_control --ready-file F` serves `POST /v1/chat/completions`
like an OpenAI server in streaming mode: every `--step-ms` one token per open stream, each
chunk carrying `kvgate_emit_ts` taken just before its own write. Measured against it, a
client's TTFT error is the client's own (plus loopback), whatever the stamping of the real
server.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402  (after patching, as gevent requires)
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402
from gevent.server import StreamServer  # noqa: E402
from gevent.socket import IPPROTO_TCP, TCP_NODELAY  # noqa: E402
from gevent.socket import socket as GSocket  # noqa: E402

HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"X-Kvgate-Replica: control\r\n\r\n"
)
ROLE = b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'


def _chunk(payload: bytes) -> bytes:
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


class Stream:
    """One open response: how many tokens are left and who waits for its end."""

    __slots__ = ("done", "left", "sent", "sock")

    def __init__(self, sock: GSocket, tokens: int) -> None:
        self.sock, self.left, self.sent, self.done = sock, tokens, 0, Event()


class ControlServer:
    """Owns the open streams; a ticker writes one token to each of them per step."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.streams: list[Stream] = []

    def tick_forever(self) -> None:
        while True:
            started = time.perf_counter()
            for stream in list(self.streams):
                self._step(stream)
            gevent.sleep(max(self.step_s - (time.perf_counter() - started), 0.0))

    def _step(self, stream: Stream) -> None:
        stream.sent += 1
        stream.left -= 1
        last = stream.left <= 0
        body = b'{"choices":[{"index":0,"delta":{"content":" token"},"finish_reason":%s}],' % (
            b'"length"' if last else b"null"
        )
        try:
            stream.sock.sendall(_chunk(body + b'"kvgate_emit_ts":%.6f}' % time.time()))
            if last:
                usage = {"prompt_tokens": 8, "completion_tokens": stream.sent}
                closing = _chunk(json.dumps({"choices": [], "usage": usage}).encode())
                stream.sock.sendall(closing + _chunk(b"[DONE]") + b"0\r\n\r\n")
        except OSError:
            last = True
        if last:
            self.streams.remove(stream)
            stream.done.set()

    def handle(self, sock: GSocket, _addr: object) -> None:
        sock.setsockopt(IPPROTO_TCP, TCP_NODELAY, 1)
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    more = sock.recv(65536)
                    if not more:
                        return
                    buf += more
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += sock.recv(65536)
                body, buf = json.loads(buf[:length]), buf[length:]
                stream = Stream(sock, int(body.get("max_tokens") or 16))
                sock.sendall(HEAD + _chunk(ROLE))
                self.streams.append(stream)
                stream.done.wait()
        except (OSError, ValueError):
            return
        finally:
            sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.client_control")
    parser.add_argument("--ready-file", required=True, help="JSON {url, pid} once listening")
    parser.add_argument("--step-ms", type=float, default=20.0, help="time between tokens")
    args = parser.parse_args(argv)
    control = ControlServer(args.step_ms / 1000.0)
    server = StreamServer(("127.0.0.1", 0), control.handle)
    server.start()
    gevent.spawn(control.tick_forever)
    url = f"http://127.0.0.1:{server.server_port}"
    ready = Path(args.ready_file)
    ready.with_suffix(".tmp").write_text(json.dumps({"url": url}))
    ready.with_suffix(".tmp").replace(ready)  # readers never see a half-written file
    gevent.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
