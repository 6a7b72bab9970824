"""The toxics of `harness.netproxy`: their wire form, validation, and what each does to a stream.

A `ToxicSpec` is what the control API holds (toxiproxy's JSON: name, type, stream, toxicity,
attributes). When a toxic meets a connection (it is added, or the connection is accepted)
and the connection draws it (probability `toxicity`), the toxic's `Effect` class is built
for that connection's stream: one object per toxic per connection, holding that
connection's state (bandwidth pacing, bytes left, a pending close timer). The stream's
writer passes every chunk through its effects in the order the toxics were added.
Removing the toxic sets the effect's `removed` event: waits cut short, timers stop.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
BANDWIDTH_SLICE_S = 0.1  # a capped stream sends at most 100 ms worth of bytes at a time


class Stream(StrEnum):
    """A direction through the proxy, named as toxiproxy names them."""

    DOWNSTREAM = "downstream"  # upstream server -> client
    UPSTREAM = "upstream"  # client -> upstream server


class ToxicError(ValueError):
    """A toxic the control API refuses; the message names the field and what is allowed."""


@dataclass(frozen=True, slots=True)
class ToxicSpec:
    """One toxic as the control API reads and writes it."""

    name: str
    type: str
    stream: Stream = Stream.DOWNSTREAM
    toxicity: float = 1.0
    attributes: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": str(self.stream),
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }

    @classmethod
    def from_json(cls, body: Any) -> ToxicSpec:
        """Validates a POST /toxics body; attributes left out take their defaults."""
        if not isinstance(body, dict):
            raise ToxicError("the body must be a JSON object with name, type and attributes")
        unknown = set(body) - {"name", "type", "stream", "toxicity", "attributes"}
        if unknown:
            raise ToxicError(
                f"unknown field(s) {sorted(unknown)}; allowed: name, type, stream, toxicity, "
                "attributes"
            )
        name = body.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise ToxicError(f"name {name!r} must be 1-64 characters of A-Z a-z 0-9 _ . -")
        toxic_type = body.get("type")
        if not isinstance(toxic_type, str) or toxic_type not in TOXIC_TYPES:
            raise ToxicError(f"unknown toxic type {toxic_type!r}; known: {sorted(TOXIC_TYPES)}")
        stream = body.get("stream", "downstream")
        if not isinstance(stream, str) or stream not in {s.value for s in Stream}:
            raise ToxicError(f"stream {stream!r} must be 'downstream' or 'upstream'")
        toxicity = body.get("toxicity", 1.0)
        if not _is_number(toxicity) or not 0.0 <= toxicity <= 1.0:
            raise ToxicError(f"toxicity {toxicity!r} must be a number from 0 to 1")
        attributes = TOXIC_TYPES[toxic_type].validate(body.get("attributes") or {})
        return cls(name, toxic_type, Stream(stream), float(toxicity), attributes)


class Link(Protocol):
    """What an effect may do to the connection it is attached to."""

    def close(self, reason: str) -> None:
        """Closes both sides of the connection (FIN), flushing what was written."""

    def reset(self, reason: str) -> None:
        """Closes both sides with TCP RST (SO_LINGER 0)."""

    def end_after_write(self) -> None:
        """Closes the connection once the chunk being handled has been written."""

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Runs a task that ends with the connection."""


class Effect:
    """What one toxic does to one stream of one connection; owns that connection's state.

    Subclasses declare ATTRIBUTES (name -> default) and override the hooks they need. The
    writer awaits `on_chunk` for each chunk in order, so a hook that waits holds back the
    chunks behind it, as toxiproxy's pipeline does.
    """

    TYPE: ClassVar[str]
    ATTRIBUTES: ClassVar[dict[str, float]]

    def __init__(self, attributes: Mapping[str, float], link: Link, rng: random.Random) -> None:
        self.link = link
        self.rng = rng
        self.removed = asyncio.Event()

    @classmethod
    def validate(cls, attributes: Any) -> dict[str, float]:
        """Attributes with defaults filled in; every attribute is a number >= 0."""
        if not isinstance(attributes, dict):
            raise ToxicError(f"{cls.TYPE}: attributes must be a JSON object")
        unknown = set(attributes) - set(cls.ATTRIBUTES)
        if unknown:
            raise ToxicError(
                f"{cls.TYPE}: unknown attribute(s) {sorted(unknown)}; "
                f"allowed: {sorted(cls.ATTRIBUTES)}"
            )
        values = {**cls.ATTRIBUTES, **attributes}
        for key, value in values.items():
            if not _is_number(value) or value < 0:
                raise ToxicError(f"{cls.TYPE}: attribute {key}={value!r} must be a number >= 0")
        return values

    def start(self) -> None:
        """Called once the effect is attached; starts any timer."""

    def max_chunk(self) -> int | None:
        """The largest chunk this effect wants to see at once (None: any size)."""
        return None

    async def on_chunk(self, data: bytes, t_read: float) -> bytes | None:
        """The data to pass on (None: nothing) for a chunk read at loop time `t_read`."""
        return data

    async def on_eof(self) -> None:
        """Called when the stream's source has closed, before the close is passed on."""

    def detach(self) -> None:
        """The toxic was removed: stop applying."""
        self.removed.set()

    async def wait_removed(self, seconds: float) -> bool:
        """Waits `seconds`, or less if the toxic is removed meanwhile; True if it was."""
        if seconds > 0 and not self.removed.is_set():
            try:
                async with asyncio.timeout(seconds):
                    await self.removed.wait()
            except TimeoutError:
                return False
        return self.removed.is_set()


class Latency(Effect):
    """Each chunk leaves `latency` ± uniform `jitter` ms after it was read, in order."""

    TYPE = "latency"
    ATTRIBUTES: ClassVar[dict[str, float]] = {"latency": 0, "jitter": 0}

    def __init__(self, attributes: Mapping[str, float], link: Link, rng: random.Random) -> None:
        super().__init__(attributes, link, rng)
        self.latency_s = attributes["latency"] / 1000
        self.jitter_s = attributes["jitter"] / 1000

    async def on_chunk(self, data: bytes, t_read: float) -> bytes | None:
        delay = self.latency_s
        if self.jitter_s:
            delay += self.rng.uniform(-self.jitter_s, self.jitter_s)
        await self.wait_removed(t_read + delay - asyncio.get_running_loop().time())
        return data


class Bandwidth(Effect):
    """Paces the stream at `rate` KB/s (1 KB = 1000 bytes, as in toxiproxy)."""

    TYPE = "bandwidth"
    ATTRIBUTES: ClassVar[dict[str, float]] = {"rate": 0}

    def __init__(self, attributes: Mapping[str, float], link: Link, rng: random.Random) -> None:
        super().__init__(attributes, link, rng)
        self.bytes_per_s = attributes["rate"] * 1000
        # Seconds of sending owed before the next chunk may go. A wait that overruns (timer
        # granularity, a busy host) drives it below 0 and the next chunks wait less, so the
        # average holds the rate; time the stream sat idle earns nothing, so it never bursts.
        self.owed_s = 0.0

    @classmethod
    def validate(cls, attributes: Any) -> dict[str, float]:
        values = super().validate(attributes)
        if values["rate"] <= 0:
            raise ToxicError(
                "bandwidth: attribute rate must be > 0 KB/s (to stop data, use a timeout toxic)"
            )
        return values

    def max_chunk(self) -> int:
        return max(1, int(self.bytes_per_s * BANDWIDTH_SLICE_S))

    async def on_chunk(self, data: bytes, t_read: float) -> bytes | None:
        loop = asyncio.get_running_loop()
        self.owed_s += len(data) / self.bytes_per_s
        start = loop.time()
        await self.wait_removed(self.owed_s)
        self.owed_s = max(self.owed_s - (loop.time() - start), -BANDWIDTH_SLICE_S)
        return data


class ResetPeer(Effect):
    """On the stream's next chunk, holds it, waits `timeout` ms, then resets the connection.

    The chunk and everything behind it are held meanwhile; if the toxic is removed before
    the reset, they pass and the connection lives on.
    """

    TYPE = "reset_peer"
    ATTRIBUTES: ClassVar[dict[str, float]] = {"timeout": 0}

    def __init__(self, attributes: Mapping[str, float], link: Link, rng: random.Random) -> None:
        super().__init__(attributes, link, rng)
        self.timeout_s = attributes["timeout"] / 1000

    async def on_chunk(self, data: bytes, t_read: float) -> bytes | None:
        if await self.wait_removed(self.timeout_s):
            return data
        self.link.reset("reset_peer toxic")
        return None


class Timeout(Effect):
    """Blackhole: drops the stream's data; closes the connection after `timeout` ms (0: never).

    Removing it restores the flow, except on a connection that lost data to it: that byte
    stream is broken, so the connection is closed (toxiproxy closes all of them).
    """

    TYPE = "timeout"
    ATTRIBUTES: ClassVar[dict[str, float]] = {"timeout": 0}

    def __init__(self, attributes: Mapping[str, float], link: Link, rng: random.Random) -> None:
        super().__init__(attributes, link, rng)
        self.timeout_s = attributes["timeout"] / 1000
        self.dropped = False

    def start(self) -> None:
        if self.timeout_s > 0:
            self.link.spawn(self._close_later())

    async def _close_later(self) -> None:
        if not await self.wait_removed(self.timeout_s):
            self.link.close("timeout toxic")

    async def on_chunk(self, data: bytes, t_read: float) -> bytes | None:
        self.dropped = True
        return None

    def detach(self) -> None:
        super().detach()
        if self.dropped:
            self.link.close("timeout toxic removed after it dropped data")


class SlowClose(Effect):
    """Passes the close of the stream's source on only `delay` ms later."""

    TYPE = "slow_close"
    ATTRIBUTES: ClassVar[dict[str, float]] = {"delay": 0}

    def __init__(self, attributes: Mapping[str, float], link: Link, rng: random.Random) -> None:
        super().__init__(attributes, link, rng)
        self.delay_s = attributes["delay"] / 1000

    async def on_eof(self) -> None:
        await self.wait_removed(self.delay_s)


class LimitData(Effect):
    """Passes `bytes` bytes of the stream (counted from when it attached), then closes."""

    TYPE = "limit_data"
    ATTRIBUTES: ClassVar[dict[str, float]] = {"bytes": 0}

    def __init__(self, attributes: Mapping[str, float], link: Link, rng: random.Random) -> None:
        super().__init__(attributes, link, rng)
        self.remaining = int(attributes["bytes"])

    async def on_chunk(self, data: bytes, t_read: float) -> bytes | None:
        data = data[: self.remaining]
        self.remaining -= len(data)
        if self.remaining <= 0:
            self.link.end_after_write()
        return data or None


TOXIC_TYPES: dict[str, type[Effect]] = {
    cls.TYPE: cls for cls in (Latency, Bandwidth, ResetPeer, Timeout, SlowClose, LimitData)
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
