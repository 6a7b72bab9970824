"""Small blocking HTTP helpers for the sampler process (plain urllib, short timeouts)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    url: str,
    *,
    method: str = "GET",
    token: str | None = None,
    timeout_s: float = 5.0,
    max_bytes: int = 64 * 1024 * 1024,
) -> Response:
    """One request; HTTP error statuses come back as a Response, network errors raise OSError."""
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read(max_bytes)
            return Response(resp.status, {k.lower(): v for k, v in resp.headers.items()}, body)
    except urllib.error.HTTPError as err:
        body = err.read(max_bytes) if err.fp else b""
        return Response(err.code, {k.lower(): v for k, v in err.headers.items()}, body)
