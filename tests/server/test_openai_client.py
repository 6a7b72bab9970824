"""The official `openai` client against a deployment: both endpoints, streaming and not,
usage with cached tokens, and the exception class it raises for each rejection."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.server.procs import Proc

pytestmark = pytest.mark.e2e
MODEL = "llama-3-8b"
SYSTEM = "You are the kvgate test assistant. " * 12  # ~100 tokens: several 16-token blocks


def client(deployment: Proc, key: str = "kvg-acme-key") -> openai.OpenAI:
    return openai.OpenAI(base_url=deployment.url + "/v1", api_key=key, max_retries=0, timeout=30)


def test_chat_non_streaming(deployment: Proc) -> None:
    resp = client(deployment).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=12,
        extra_body={"ignore_eos": True},
    )
    assert resp.choices[0].finish_reason == "length"
    assert resp.choices[0].message.role == "assistant"
    assert resp.usage is not None and resp.usage.completion_tokens == 12
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 12
    assert len(resp.choices[0].message.content or "") > 0


def test_chat_streaming_with_usage(deployment: Proc) -> None:
    chunks = list(
        client(deployment).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "stream please"}],
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    first, usage = chunks[0], chunks[-1]
    assert first.choices[0].delta.role == "assistant" and not first.choices[0].delta.content
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 9
    assert chunks[-2].choices[0].finish_reason == "length"
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.completion_tokens == 9


def test_natural_stop_without_ignore_eos(deployment: Proc) -> None:
    resp = client(deployment).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "short"}], max_tokens=600
    )
    assert resp.usage is not None and 1 <= resp.usage.completion_tokens <= 512
    assert resp.choices[0].finish_reason == "stop"


def test_completions_both_ways(deployment: Proc) -> None:
    c = client(deployment)
    plain = c.completions.create(
        model=MODEL, prompt="once upon a time", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert plain.usage is not None and plain.usage.completion_tokens == 5
    assert plain.choices[0].text and plain.choices[0].finish_reason == "length"
    streamed = list(
        c.completions.create(
            model=MODEL,
            prompt="once upon a time",
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert sum(1 for s in streamed if s.choices and s.choices[0].text) == 4
    assert streamed[-1].usage is not None and streamed[-1].usage.prompt_tokens > 0


def test_cached_tokens_reported_for_shared_prefix(deployment: Proc) -> None:
    c = client(deployment)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "q"},
    ]
    headers = {"X-Kvgate-Prefix-Tokens": "96"}
    cached = []
    for _ in range(2):
        resp = c.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=2, extra_headers=headers
        )
        assert resp.usage is not None and resp.usage.prompt_tokens_details is not None
        cached.append(resp.usage.prompt_tokens_details.cached_tokens)
    assert cached[0] == 0
    assert cached[1] == 96  # six full 16-token blocks of the declared prefix


def test_error_classes(deployment: Proc) -> None:
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as bad:
        client(deployment).chat.completions.create(model=MODEL, messages=msgs, max_tokens=0)
    assert bad.value.code == "invalid_request" and "max_tokens" in bad.value.message
    with pytest.raises(openai.AuthenticationError):
        client(deployment, "nope").chat.completions.create(model=MODEL, messages=msgs)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        client(deployment).chat.completions.create(
            model=MODEL, messages=msgs, extra_headers={"X-Priority": "critical"}
        )
    assert denied.value.code == "priority_not_allowed"
    with pytest.raises(openai.RateLimitError) as limited:
        client(deployment, "kvg-tiny-key").chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=4000
        )
    assert limited.value.code == "tenant_quota"
    assert int(limited.value.response.headers["Retry-After"]) >= 1
    assert limited.value.response.headers["X-Kvgate-Quota-Limit-Tokens"] == "2048"
    with pytest.raises(openai.NotFoundError):
        client(deployment).chat.completions.create(model="gpt-unknown", messages=msgs)
