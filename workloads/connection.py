"""Cooperative HTTP/1.1 connections (gevent) that stamp every read with its arrival time.

Plain TCP connections read a non-blocking socket directly and park the greenlet on one
persistent libev watcher, which costs a fraction of gevent's socket wrapper per read. On
Linux each read carries the kernel's receive timestamp (SO_TIMESTAMPNS), so a greenlet that
runs late because 200 others woke first still learns when the bytes actually arrived;
elsewhere, and over TLS, the stamp is `time.perf_counter()` taken as the read returns.
Deadlines are the caller's (one gevent.Timeout per request), not per read.
"""

from __future__ import annotations

import _socket
import contextlib
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, ClassVar
from urllib.parse import urlsplit

import gevent.socket as gsocket
import gevent.ssl as gssl
from gevent import get_hub

_SO_TIMESTAMPNS = 35  # Linux <asm-generic/socket.h>; Python does not export the name
_TIMESPEC = struct.Struct("qq")
_ANCILLARY_BYTES = gsocket.CMSG_SPACE(_TIMESPEC.size) if hasattr(gsocket, "CMSG_SPACE") else 0
# A kernel stamp further than this from "now" is not trusted (clock stepped, odd kernel).
_STAMP_SANITY_S = 60.0
_READ, _WRITE = 1, 2  # libev event masks
RECV_BYTES = 65536


class Target:
    """Where requests go: scheme, host and port parsed once from a base URL."""

    __slots__ = ("base_path", "host", "port", "tls")

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"target URL {base_url!r} must look like http://HOST:PORT or https://HOST:PORT; "
                "set the user class's `host` (or Locust's --host)"
            )
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.base_path = parts.path.rstrip("/")

    @property
    def host_header(self) -> str:
        default = 443 if self.tls else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


class Connection:
    """One open TCP (or TLS) connection, used by one greenlet at a time.

    Times are on the `time.perf_counter()` clock; empty `bytes` means the peer closed.
    Invariant: `_raw` (plain TCP) is non-blocking and only ever waited on through
    `_read_watcher` / `_write_watcher`; TLS goes through `_tls`.
    """

    __slots__ = (
        "_drained",
        "_hub",
        "_kernel_stamps",
        "_raw",
        "_read_watcher",
        "_tls",
        "_write_watcher",
        "requests_sent",
    )

    # Off only to measure what kernel receive stamps are worth (the client benchmark).
    use_kernel_stamps: ClassVar[bool] = True

    def __init__(self, target: Target, connect_timeout_s: float) -> None:
        sock = gsocket.create_connection((target.host, target.port), timeout=connect_timeout_s)
        sock.setsockopt(gsocket.IPPROTO_TCP, gsocket.TCP_NODELAY, 1)
        self.requests_sent = 0
        self._drained = False
        self._kernel_stamps = False
        self._tls: Any = None
        self._raw: Any = None
        if target.tls:
            sock.settimeout(None)  # the request's own deadline bounds every wait
            self._tls = gssl.create_default_context().wrap_socket(sock, server_hostname=target.host)
            return
        family, kind, proto = sock.family, sock.type, sock.proto
        raw = _socket.socket(family, kind, proto, fileno=sock.detach())
        raw.setblocking(False)
        if self.use_kernel_stamps and sys.platform == "linux" and _ANCILLARY_BYTES:
            with contextlib.suppress(OSError):
                raw.setsockopt(_socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self._kernel_stamps = True
        self._raw = raw
        self._hub = get_hub()
        self._read_watcher = self._hub.loop.io(raw.fileno(), _READ)
        self._write_watcher = self._hub.loop.io(raw.fileno(), _WRITE)

    def send(self, data: bytes) -> None:
        self.requests_sent += 1
        self._drained = False
        if self._tls is not None:
            self._tls.sendall(data)
            return
        view = memoryview(data)
        while view:
            try:
                view = view[self._raw.send(view) :]
            except BlockingIOError:
                self._hub.wait(self._write_watcher)

    def peer_closed(self) -> bool:
        """For an idle keep-alive connection: has the server closed it (or sent something
        unasked, which makes it unusable too)? Plain TCP only; TLS says False."""
        if self._raw is None:
            return False
        try:
            self._raw.recv(1, _socket.MSG_PEEK)
        except BlockingIOError:
            return False  # open and quiet: usable
        except OSError:
            return True
        return True  # end of stream, or bytes nobody asked for

    @property
    def can_watch(self) -> bool:
        """Plain TCP: reads may run in an event-loop callback (`watch` / `recv_now`)."""
        return self._raw is not None

    def watch(self, callback: Callable[[], None]) -> None:
        """Calls `callback` from the event loop whenever the socket is readable."""
        self._read_watcher.start(callback)

    def unwatch(self) -> None:
        if self._raw is not None and self._raw.fileno() >= 0:
            self._read_watcher.stop()

    def recv(self, stamped: bool = False) -> tuple[bytes, float, float]:
        """Waits for bytes: `(data, arrival, read_at)`; see `recv_now`."""
        if self._tls is not None:
            data = self._tls.recv(RECV_BYTES)
            now = time.perf_counter()
            return data, now, now
        if self._drained:
            # The last read emptied the socket: park until readable instead of paying for a
            # read that would fail (libev reports an fd that is already readable at once).
            self._hub.wait(self._read_watcher)
        while True:
            got = self.recv_now(stamped)
            if got is not None:
                return got
            self._hub.wait(self._read_watcher)

    def read_now(self) -> bytes | None:
        """Plain TCP: what is there, without waiting (None: nothing yet) and without a stamp;
        the caller takes the time. The per-token read, with nothing built around it."""
        try:
            data: bytes = self._raw.recv(RECV_BYTES)
        except BlockingIOError:
            return None
        self._drained = len(data) < RECV_BYTES
        return data

    def recv_now(self, stamped: bool) -> tuple[bytes, float, float] | None:
        """Reads what is there without waiting (None: nothing yet) as `(data, arrival,
        read_at)`: `read_at` is when the read returned; `arrival` is the kernel's receive
        stamp when `stamped` and the OS gives one (a costlier recvmsg), else `read_at`."""
        try:
            if not (stamped and self._kernel_stamps):
                data = self._raw.recv(RECV_BYTES)
                self._drained = len(data) < RECV_BYTES
                now = time.perf_counter()
                return data, now, now
            data, ancillary, _flags, _addr = self._raw.recvmsg(RECV_BYTES, _ANCILLARY_BYTES)
        except BlockingIOError:
            return None
        self._drained = len(data) < RECV_BYTES
        read_at = time.perf_counter()
        for level, kind, payload in ancillary:
            if level == _socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                sec, nsec = _TIMESPEC.unpack_from(payload)
                age = time.time() - (sec + nsec * 1e-9)
                if -0.001 <= age <= _STAMP_SANITY_S:
                    return data, read_at - max(age, 0.0), read_at
        return data, read_at, read_at

    def close(self) -> None:
        """Closes at once; closing mid-stream is how a request is cancelled."""
        if self._tls is not None:
            with contextlib.suppress(OSError):
                self._tls.close()
            return
        self._read_watcher.close()
        self._write_watcher.close()
        # Already reset by the peer: then closing is all that is left to do.
        with contextlib.suppress(OSError):
            self._raw.shutdown(_socket.SHUT_RDWR)
        self._raw.close()
