"""A TCP fault proxy with toxiproxy's semantics: `python -m harness.netproxy`, the engine of
the `network` fault kind (toxics: toxics.py; client: client.py).

Each accepted client connection opens one upstream connection and two pipes: "downstream"
(upstream -> client) and "upstream" (client -> upstream). A pipe is a reader task that
stamps each chunk with its read time into a bounded queue, and a writer task that passes
each chunk through the pipe's effects, then writes it. Toxics live in the `Proxy`; adding
one attaches an effect to every live connection that draws it (probability `toxicity`,
drawn once per connection), and each new connection draws every toxic present when it
opens. The writer reads its pipe's effects afresh for every chunk, so a toxic applies from
the next chunk on, and removing it detaches the effects at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import random
import signal
import socket
import struct
import sys
from collections.abc import Coroutine, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from harness.netproxy.toxics import TOXIC_TYPES, Effect, Stream, ToxicError, ToxicSpec

log = logging.getLogger("netproxy")
READ_BYTES = 64 * 1024
QUEUE_CHUNKS = 64  # per pipe: at most 4 MiB read ahead of a held-back writer
CONNECT_TIMEOUT_S = 10.0
CLOSE_FLUSH_S = 5.0  # how long a graceful close may take to flush before it aborts
EXIT_USAGE = 2


@dataclass(slots=True)
class ProxyStats:
    """Counters since the proxy started (GET /stats)."""

    accepted: int = 0  # client connections accepted
    active: int = 0  # connections open now
    reset: int = 0  # connections the proxy ended with TCP RST
    upstream_failed: int = 0  # client connections closed because upstream refused
    bytes_downstream: int = 0  # bytes written to clients
    bytes_upstream: int = 0  # bytes written to the upstream server


@dataclass(slots=True)
class Chunk:
    data: bytes
    t_read: float  # loop time at which it was read


class Pipe:
    """One direction of one connection; implements `Link` for its effects.

    `effects` maps toxic name -> effect in the order the toxics were added (the chain).
    """

    def __init__(
        self,
        conn: Connection,
        stream: Stream,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
    ) -> None:
        self.conn = conn
        self.stream = stream
        self.src = src
        self.dst = dst
        self.effects: dict[str, Effect] = {}
        self.queue: asyncio.Queue[Chunk | None] = asyncio.Queue(QUEUE_CHUNKS)
        self.ending = False

    def close(self, reason: str) -> None:
        self.conn.close(reason)

    def reset(self, reason: str) -> None:
        self.conn.reset(reason)

    def end_after_write(self) -> None:
        self.ending = True

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.conn.spawn(coro)

    async def read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await self.src.read(READ_BYTES):
                await self.queue.put(Chunk(data, loop.time()))
        except OSError as err:  # the peer reset: pass the reset on
            self.conn.reset(f"{self.stream} source: {err!r}")
            return
        await self.queue.put(None)

    async def write(self) -> None:
        try:
            while (chunk := await self.queue.get()) is not None:
                for data in self._slices(chunk.data):
                    await self._deliver(await self._through_effects(data, chunk.t_read))
                    if self.ending:
                        self.conn.close(f"{self.stream}: limit_data reached")
                        return
            for effect in list(self.effects.values()):
                await effect.on_eof()
            self.conn.half_close(self)
        except OSError as err:  # the destination went away
            self.conn.close(f"{self.stream} destination: {err!r}")

    def _slices(self, data: bytes) -> list[bytes]:
        sizes = [size for e in self.effects.values() if (size := e.max_chunk()) is not None]
        step = min(sizes, default=len(data)) or 1
        return [data[i : i + step] for i in range(0, len(data), step)]

    async def _through_effects(self, data: bytes, t_read: float) -> bytes | None:
        for effect in list(self.effects.values()):
            if effect.removed.is_set():
                continue
            passed = await effect.on_chunk(data, t_read)
            if passed is None:
                return None
            data = passed
        return data

    async def _deliver(self, data: bytes | None) -> None:
        if not data or self.conn.closing:
            return
        self.dst.write(data)
        await self.dst.drain()
        self.conn.count_bytes(self.stream, len(data))


class Connection:
    """One client connection and its upstream connection, until either end closes.

    Invariant: once `closing` is set, nothing more is written and `done` is set; `run`
    then cancels every task of the connection and closes (or has aborted) both sockets.
    """

    def __init__(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        stats: ProxyStats,
    ) -> None:
        self.client = client[1]
        self.upstream = upstream[1]
        self.stats = stats
        self.pipes = {
            Stream.DOWNSTREAM: Pipe(self, Stream.DOWNSTREAM, upstream[0], client[1]),
            Stream.UPSTREAM: Pipe(self, Stream.UPSTREAM, client[0], upstream[1]),
        }
        self.half_closed: set[Stream] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.closing = False
        self.was_reset = False
        self.done = asyncio.Event()  # set when the connection is to end
        self.finished = asyncio.Event()  # set when both sockets are closed

    def attach(self, spec: ToxicSpec, rng: random.Random) -> None:
        if rng.random() >= spec.toxicity:
            return  # this connection drew "unaffected" for this toxic
        pipe = self.pipes[spec.stream]
        effect = TOXIC_TYPES[spec.type](spec.attributes, pipe, rng)
        pipe.effects[spec.name] = effect
        effect.start()

    def detach(self, name: str) -> None:
        for pipe in self.pipes.values():
            effect = pipe.effects.pop(name, None)
            if effect is not None:
                effect.detach()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and (err := task.exception()) is not None:
            log.error("connection task failed", exc_info=err)
            self.reset(f"internal error: {err!r}")

    async def run(self) -> None:
        for pipe in self.pipes.values():
            self.spawn(pipe.read())
            self.spawn(pipe.write())
        try:
            await self.done.wait()
        finally:
            for task in list(self.tasks):
                task.cancel()
            self.closing = True
            await self._close_sockets()
            self.finished.set()

    def count_bytes(self, stream: Stream, n: int) -> None:
        if stream is Stream.DOWNSTREAM:
            self.stats.bytes_downstream += n
        else:
            self.stats.bytes_upstream += n

    def half_close(self, pipe: Pipe) -> None:
        """The pipe's source closed: pass the FIN on; both closed ends the connection."""
        self.half_closed.add(pipe.stream)
        if len(self.half_closed) == len(self.pipes):
            self.close("both ends closed")
        elif pipe.dst.can_write_eof():
            pipe.dst.write_eof()

    def close(self, reason: str) -> None:
        if not self.closing:
            log.debug("closing connection: %s", reason)
            self.closing = True
            self.done.set()

    def reset(self, reason: str) -> None:
        if self.closing:
            return
        log.debug("resetting connection: %s", reason)
        self.closing = self.was_reset = True
        self.stats.reset += 1
        for writer in (self.client, self.upstream):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        self.done.set()

    async def _close_sockets(self) -> None:
        writers = (self.client, self.upstream)
        if not self.was_reset:
            for writer in writers:
                writer.close()
            closed = asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closed, CLOSE_FLUSH_S)
        for writer in writers:
            writer.transport.abort()  # no-op once closed; a stalled flush ends here


class Proxy:
    """The toxics and the live connections; every toxic change reaches every connection."""

    def __init__(self, upstream: tuple[str, int], rng: random.Random | None = None) -> None:
        self.upstream = upstream
        self.rng = rng or random.Random()
        self.toxics: dict[str, ToxicSpec] = {}
        self.connections: set[Connection] = set()
        self.stats = ProxyStats()

    def add(self, spec: ToxicSpec) -> None:
        if spec.name in self.toxics:
            raise ToxicError(f"a toxic named {spec.name!r} exists; remove it first")
        self.toxics[spec.name] = spec
        for conn in list(self.connections):
            conn.attach(spec, self.rng)

    def remove(self, name: str) -> bool:
        if self.toxics.pop(name, None) is None:
            return False
        for conn in list(self.connections):
            conn.detach(name)
        return True

    async def handle_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.stats.accepted += 1
        # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, which ours
        # (socket() with proto 0) is not: without it, Nagle holds a response's second
        # segment for the client's delayed ACK (40 ms).
        with contextlib.suppress(OSError):
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            upstream = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as err:
            log.warning("upstream %s:%s refused: %r", *self.upstream, err)
            self.stats.upstream_failed += 1
            writer.close()
            return
        conn = Connection((reader, writer), upstream, self.stats)
        for spec in self.toxics.values():
            conn.attach(spec, self.rng)
        self.connections.add(conn)
        self.stats.active += 1
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            self.stats.active -= 1

    async def aclose(self) -> None:
        """Closes every connection and waits (boundedly) until their sockets are closed."""
        conns = list(self.connections)
        for conn in conns:
            conn.close("proxy stopping")
        if conns:
            finished = asyncio.gather(*(conn.finished.wait() for conn in conns))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished, CLOSE_FLUSH_S)


def control_app(proxy: Proxy) -> web.Application:
    """The toxiproxy-like control API over `proxy`."""

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def list_toxics(_: web.Request) -> web.Response:
        return web.json_response([spec.to_json() for spec in proxy.toxics.values()])

    async def add_toxic(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError as err:  # not JSON, or not UTF-8
            return _error(400, f"the body is not JSON: {err}")
        try:
            spec = ToxicSpec.from_json(body)
            proxy.add(spec)
        except ToxicError as err:
            return _error(400, str(err))
        return web.json_response(spec.to_json())

    async def remove_toxic(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not proxy.remove(name):
            return _error(404, f"no toxic named {name!r}; GET /toxics lists them")
        return web.Response(status=204)

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(asdict(proxy.stats))

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/toxics", list_toxics)
    app.router.add_post("/toxics", add_toxic)
    app.router.add_delete("/toxics/{name}", remove_toxic)
    app.router.add_get("/stats", stats)
    return app


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def parse_address(value: str, what: str, loopback: bool) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [::1]:PORT) -> (host, port); `loopback` refuses any other host."""
    host, sep, port_text = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{what} {value!r} must be HOST:PORT, e.g. 127.0.0.1:0")
    if loopback:
        if host == "localhost":
            host = "127.0.0.1"
        try:
            is_loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            is_loopback = False
        if not is_loopback:
            raise ValueError(
                f"{what} {value!r} is not a loopback address; the proxy only listens on "
                "127.0.0.0/8 or ::1 (e.g. 127.0.0.1:0)"
            )
    return host, int(port_text)


def _format_address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bound_socket(address: tuple[str, int]) -> socket.socket:
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(128)
    sock.setblocking(False)
    return sock


@dataclass(frozen=True, slots=True)
class Config:
    listen: tuple[str, int]
    control: tuple[str, int]
    upstream: tuple[str, int]
    ready_file: Path | None
    seed: int | None


async def serve(config: Config, listen_sock: socket.socket, control_sock: socket.socket) -> None:
    """Serves until SIGTERM or SIGINT, then closes every connection and the control API."""
    proxy = Proxy(config.upstream, random.Random(config.seed))
    server = await asyncio.start_server(proxy.handle_client, sock=listen_sock)
    runner = web.AppRunner(control_app(proxy), access_log=None)
    await runner.setup()
    await web.SockSite(runner, control_sock).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ready = {
        "listen": _format_address(listen_sock),
        "control": f"http://{_format_address(control_sock)}",
        "pid": os.getpid(),
    }
    if config.ready_file:
        _write_atomically(config.ready_file, json.dumps(ready))
    log.info("ready: %s, upstream %s:%s", ready, *config.upstream)
    try:
        await stop.wait()
    finally:
        server.close()
        await proxy.aclose()
        await runner.cleanup()
        if config.ready_file:
            config.ready_file.unlink(missing_ok=True)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.netproxy", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:0", help="loopback HOST:PORT (0: any)")
    parser.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--control", default="127.0.0.1:0", help="loopback HOST:PORT of the API")
    parser.add_argument("--ready-file", help="write {listen, control, pid} here once bound")
    parser.add_argument("--seed", type=int, help="seed for toxicity draws and jitter")
    parser.add_argument("--log-level", default="WARNING")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="netproxy %(levelname)s %(message)s")
    try:
        config = Config(
            listen=parse_address(args.listen, "--listen", loopback=True),
            control=parse_address(args.control, "--control", loopback=True),
            upstream=parse_address(args.upstream, "--upstream", loopback=False),
            ready_file=Path(args.ready_file) if args.ready_file else None,
            seed=args.seed,
        )
    except ValueError as err:
        print(f"netproxy: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        listen_sock, control_sock = _bound_socket(config.listen), _bound_socket(config.control)
    except OSError as err:
        print(f"netproxy: cannot listen: {err}", file=sys.stderr)
        return 1
    asyncio.run(serve(config, listen_sock, control_sock))
    return 0
