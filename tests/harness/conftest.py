"""Fixtures shared by the harness tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A loopback URL where connections are refused: its port is the OS's, bound and never
    listening for the test's length, so no other process can take it meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
