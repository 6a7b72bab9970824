"""The request headers the reference server reads, validated in one place for the gateway and
the replica so the two can never disagree on a value; plus the tenant-scoped request key and
the constant-time secret comparison both processes use.

Numbers in headers and cursors are plain ASCII digits with a length cap: `str.isdigit()` and
`int()` accept superscripts, other scripts' digits, signs, underscores and 4,300-digit values,
each of which once made the gateway and the replica read the same header differently.
"""

from __future__ import annotations

import hmac
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from server.protocol import ApiError

REQUEST_ID_HEADER = "X-Request-Id"
PRIORITY_HEADER = "X-Priority"
PREFIX_TOKENS_HEADER = "X-Kvgate-Prefix-Tokens"
PREFIX_PUBLIC_HEADER = "X-Kvgate-Prefix-Public"
DEBUG_TIMING_HEADER = "X-Kvgate-Debug-Timing"

MAX_PREFIX_DIGITS = 9  # a prefix longer than any context window is clamped, never parsed big
MAX_OFFSET_DIGITS = 18  # cursor offsets fit a signed 64-bit file offset
# What is left of a request's queue deadline, in ms: sent only by the gateway (which may have
# spent part of it on a replica that died), read by a replica only with the internal token.
QUEUE_DEADLINE_HEADER = "X-Kvgate-Queue-Deadline-Ms"
MAX_DEADLINE_DIGITS = 9
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,200}")
_DIGITS = re.compile(r"[0-9]+")
# The scoped key joins tenant and request id with a tab, which a request id cannot contain.
_SCOPE_SEP = "\t"


@dataclass(frozen=True, slots=True)
class ClientHeaders:
    """What a completion request's headers ask for, already validated."""

    request_id: str
    priority: str | None
    prefix_tokens: int | None
    prefix_public: bool
    debug_timing: bool


def client_headers(headers: Mapping[str, str]) -> ClientHeaders:
    """Parse the client-settable headers; ApiError(400) names the first bad one."""
    refuse_content_encoding(headers)
    return ClientHeaders(
        request_id=request_id(headers.get(REQUEST_ID_HEADER)),
        priority=headers.get(PRIORITY_HEADER) or None,
        prefix_tokens=_prefix_tokens(headers.get(PREFIX_TOKENS_HEADER)),
        prefix_public=headers.get(PREFIX_PUBLIC_HEADER) == "1",
        debug_timing=headers.get(DEBUG_TIMING_HEADER) == "1",
    )


def request_id(header: str | None) -> str:
    """The client's X-Request-Id (printable ASCII, at most 200 chars), or a fresh one."""
    if header is None:
        return uuid.uuid4().hex
    if not _REQUEST_ID.fullmatch(header):
        raise ApiError(
            400,
            "invalid_request",
            "X-Request-Id must be 1-200 printable ASCII characters without spaces",
        )
    return header


def refuse_content_encoding(headers: Mapping[str, str]) -> None:
    """Compressed request bodies are refused: inflating one is unbounded work on the event
    loop (a 1 MB gzip body can inflate to 1 GB), and no OpenAI client compresses requests."""
    encoding = headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ApiError(
            415,
            "unsupported_encoding",
            f"Content-Encoding '{_printable(encoding)}' is not accepted; send the JSON body "
            f"uncompressed (at most the body limit)",
        )


def _prefix_tokens(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not (_DIGITS.fullmatch(raw) and len(raw) <= MAX_PREFIX_DIGITS):
        raise ApiError(
            400,
            "invalid_request",
            f"{PREFIX_TOKENS_HEADER} must be a non-negative integer of at most "
            f"{MAX_PREFIX_DIGITS} ASCII digits (got '{_printable(raw)}')",
        )
    return int(raw)


def queue_deadline_ms(raw: str | None, ceiling_ms: int) -> int | None:
    """The gateway's remaining queue deadline (QUEUE_DEADLINE_HEADER), within
    (0, ceiling_ms]; None when absent or not plain ASCII digits."""
    if raw is None or not (_DIGITS.fullmatch(raw) and len(raw) <= MAX_DEADLINE_DIGITS):
        return None
    return max(1, min(int(raw), ceiling_ms))


def parse_offset(raw: str, what: str) -> int:
    """A non-negative cursor offset of at most MAX_OFFSET_DIGITS ASCII digits."""
    if not (_DIGITS.fullmatch(raw) and len(raw) <= MAX_OFFSET_DIGITS):
        raise ApiError(
            400,
            "invalid_request",
            f"{what} '{_printable(raw)}' is not a cursor this server gave out; pass the "
            f"X-Next-Cursor header of the previous answer, or omit 'after' to start over",
        )
    return int(raw)


def scoped_key(tenant: str, rid: str) -> str:
    """The key a request is held under: request ids are unique per tenant, not globally, so
    one tenant can neither see nor block another's ids."""
    return f"{tenant}{_SCOPE_SEP}{rid}"


def client_id(key: str) -> str:
    """The client's request id inside a scoped key (the key itself if it is not scoped)."""
    return key.rpartition(_SCOPE_SEP)[2]


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison that takes any header value: `hmac.compare_digest` raises on
    non-ASCII str, and header bytes that are not UTF-8 arrive as lone surrogates."""
    if not expected:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


def _printable(value: str, limit: int = 60) -> str:
    """A header value safe to quote in a message: escaped, and cut to `limit` characters."""
    text = value.encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."
