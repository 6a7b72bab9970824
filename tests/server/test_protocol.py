"""Request parsing never fails with anything but a 4xx ApiError, whatever the body."""

from __future__ import annotations

import json
from typing import Any, Literal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.protocol import ApiError, ParsedRequest, parse_body

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
fields = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "max_tokens",
        "max_completion_tokens",
        "stream",
        "stream_options",
        "ignore_eos",
        "n",
        "temperature",
        "stop",
        "tools",
        "logprobs",
        "x",
    ]
)
bodies = st.dictionaries(fields, values, max_size=6)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "robot"]), "content": values}
    ),
    max_size=3,
)


def _parse(kind: Literal["chat", "completion"], raw: bytes) -> None:
    try:
        parsed = parse_body(kind, raw)
    except ApiError as err:
        assert 400 <= err.status < 500 and err.message
        body = json.loads(err.body())
        assert set(body["error"]) == {"message", "type", "code"}
        return
    assert isinstance(parsed, ParsedRequest)
    assert parsed.max_tokens is None or parsed.max_tokens >= 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["chat", "completion"]), body=bodies, msgs=messages)
def test_any_json_body_is_parsed_or_rejected_cleanly(
    kind: Literal["chat", "completion"], body: dict[str, Any], msgs: list[dict[str, Any]]
) -> None:
    if kind == "chat" and "messages" not in body:
        body["messages"] = msgs
    body.setdefault("model", "llama-3-8b")
    _parse(kind, json.dumps(body).encode())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=200))
def test_any_bytes_are_parsed_or_rejected_cleanly(raw: bytes) -> None:
    _parse("chat", raw)
