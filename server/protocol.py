"""The OpenAI wire format the reference server accepts: pydantic request models, the parsed
request both gateway and replica work from, and OpenAI-style error objects.

Every way a body can be wrong becomes an `ApiError` with a 4xx status and a message that names
the field and what to do; nothing in here can raise anything else on client input.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_BODY_BYTES = 8 * 1024 * 1024

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "server_error",
    503: "server_error",
}

# Parameters the OpenAI API has but the reference server cannot honour: rejected by name.
UNSUPPORTED = {
    "tools": "tool calling",
    "tool_choice": "tool calling",
    "functions": "function calling",
    "function_call": "function calling",
    "logprobs": "log probabilities",
    "top_logprobs": "log probabilities",
    "best_of": "best_of sampling",
    "echo": "prompt echo",
    "suffix": "suffix insertion",
    "audio": "audio output",
    "modalities": "non-text output",
    "prediction": "predicted outputs",
}


class ApiError(Exception):
    """An HTTP error answer: status, OpenAI error code, a sentence for people, extra headers."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        if retry_after_s is None and status in (429, 503):
            retry_after_s = 1.0  # the contract: every 429 and 503 says when to come back
        self.retry_after_s = retry_after_s
        if retry_after_s is not None:
            self.headers["Retry-After"] = str(max(1, round(retry_after_s)))

    def body(self) -> bytes:
        return error_body(self.message, ERROR_TYPES.get(self.status, "server_error"), self.code)


def error_body(message: str, type_: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "code": code}}).encode()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Common(_Strict):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    ignore_eos: bool = False
    n: int = Field(1, ge=1, le=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    seed: int | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
    response_format: dict[str, Any] | None = None
    store: bool | None = None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] = Field(min_length=1)


@dataclass(slots=True)
class ParsedRequest:
    """What both gateway and replica need from a valid body."""

    kind: Literal["chat", "completion"]
    model: str
    messages: list[tuple[str, str]] = field(default_factory=list)
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    ignore_eos: bool = False


def parse_body(kind: Literal["chat", "completion"], body: bytes) -> ParsedRequest:
    """Validate a request body; raises ApiError(400) naming the first problems found."""
    if len(body) > MAX_BODY_BYTES:
        raise body_too_large(len(body))
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(
            400, "invalid_request", f"request body is not valid JSON ({exc}); send a JSON object"
        ) from None
    except RecursionError:
        raise ApiError(
            400, "invalid_request", "request body nests too deeply to parse; flatten it"
        ) from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "request body must be a JSON object")
    for name, what in UNSUPPORTED.items():
        value = data.pop(name, None)
        # Neutral values (false, null, empty, best_of=1) ask for nothing; accept them.
        if value not in (None, False, []) and not (name == "best_of" and value == 1):
            raise ApiError(
                400,
                "invalid_request",
                f"parameter '{name}' ({what}) is not supported by this server; remove it",
            )
    model_cls = ChatRequest if kind == "chat" else CompletionRequest
    try:
        req = model_cls.model_validate(data)
    except ValidationError as exc:
        raise ApiError(400, "invalid_request", describe_validation(exc, kind)) from None
    return _to_parsed(req)


def _to_parsed(req: ChatRequest | CompletionRequest) -> ParsedRequest:
    max_tokens = req.max_tokens
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(
            400,
            "invalid_request",
            f"max_tokens must be at least 1 (got {max_tokens}); omit it for the server default",
        )
    if isinstance(req, ChatRequest) and req.response_format not in (None, {"type": "text"}):
        raise ApiError(
            400,
            "invalid_request",
            "parameter 'response_format' other than {'type': 'text'} is not supported; remove it",
        )
    parsed = ParsedRequest(
        kind="chat" if isinstance(req, ChatRequest) else "completion",
        model=req.model,
        stream=req.stream,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        max_tokens=max_tokens,
        ignore_eos=req.ignore_eos,
    )
    if isinstance(req, ChatRequest):
        parsed.messages = [(m.role, m.text()) for m in req.messages]
    elif isinstance(req.prompt, str):
        parsed.prompt_text = req.prompt
    elif all(isinstance(p, str) for p in req.prompt):
        if len(req.prompt) != 1:
            raise ApiError(
                400,
                "invalid_request",
                f"'prompt' holds {len(req.prompt)} prompts; this server takes one per request",
            )
        parsed.prompt_text = str(req.prompt[0])
    else:
        parsed.prompt_ids = [int(p) for p in req.prompt]
    return parsed


# pydantic names the member of a union it tried ("str", "list[TextPart]"): not a field.
_UNION_TAG = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|function-.*)$")


def describe_validation(exc: ValidationError, kind: str) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"] if not _UNION_TAG.match(str(x)))
        loc = loc or "body"
        if err["type"] == "missing":
            need = "messages (a list of {role, content})" if kind == "chat" else "prompt"
            parts.append(f"'{loc}' is required" + (f"; send {need}" if loc in need else ""))
        elif err["type"] == "extra_forbidden":
            parts.append(f"unrecognized parameter '{loc}'; remove it")
        else:
            parts.append(f"'{loc}': {err['msg']} (got {_short(err.get('input'))})")
    return "invalid request: " + "; ".join(parts)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,200}$")


def request_id(header: str | None) -> str:
    """The client's X-Request-Id (printable ASCII, at most 200 chars), or a fresh one."""
    if header is None:
        return uuid.uuid4().hex
    if not _REQUEST_ID.match(header):
        raise ApiError(
            400,
            "invalid_request",
            "X-Request-Id must be 1-200 printable ASCII characters without spaces",
        )
    return header


def body_too_large(size: int) -> ApiError:
    return ApiError(
        413,
        "body_too_large",
        f"request body is {size} bytes, over the {MAX_BODY_BYTES}-byte limit; send a shorter "
        f"prompt",
    )


def model_not_found(model: str, served: str) -> ApiError:
    return ApiError(
        404,
        "model_not_found",
        f"model '{model}' is not served here; use '{served}' (see GET /v1/models)",
    )
