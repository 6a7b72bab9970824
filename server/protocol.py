"""The OpenAI wire format the reference server accepts: pydantic request models, the parsed
request both gateway and replica work from, and OpenAI-style error objects.

Every way a body can be wrong becomes an `ApiError` with a 4xx status and a message that names
the field and what to do; nothing in here can raise anything else on client input.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_TOKENS_LIMIT = 1_000_000_000  # far above any context window; keeps the number small

log = logging.getLogger("kvgate.server")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    411: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
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


class _Lenient(BaseModel):
    """Unknown fields are kept aside (and logged by `parse_body`), not refused: clients built
    for vLLM send its extensions to every OpenAI-compatible server."""

    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(_Lenient):
    include_usage: bool = False
    # vLLM: with include_usage, every chunk carries the usage so far.
    continuous_usage_stats: bool = False


class _Common(_Lenient):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, le=MAX_TOKENS_LIMIT)
    ignore_eos: bool = False
    # vLLM sampling extensions: validated and accepted. `min_tokens` shapes the simulated
    # output; the others change nothing the simulator produces.
    min_tokens: int = Field(0, ge=0, le=MAX_TOKENS_LIMIT)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    length_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    add_special_tokens: bool | None = None
    # vLLM's request priority is not ours: the class comes from X-Priority and the key only.
    priority: int | None = None
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
    max_completion_tokens: int | None = Field(None, le=MAX_TOKENS_LIMIT)
    response_format: dict[str, Any] | None = None
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


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
    continuous_usage: bool = False
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    ignored: tuple[str, ...] = ()  # unknown fields accepted and ignored

    def prompt_chars(self) -> int:
        """Characters of prompt text (chat: message contents), before any template."""
        if self.kind == "chat":
            return sum(len(text) for _, text in self.messages)
        return len(self.prompt_text or "")


def parse_body(kind: Literal["chat", "completion"], body: bytes) -> ParsedRequest:
    """Validate a request body; raises ApiError(400) naming the first problems found."""
    if len(body) > MAX_BODY_BYTES:
        raise body_too_large(len(body))
    try:
        # Strict UTF-8 first: json.loads(bytes) lets raw surrogate bytes through.
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ApiError(
            400,
            "invalid_request",
            f"request body is not valid UTF-8 (byte {exc.start}); send UTF-8 encoded JSON",
        ) from None
    except json.JSONDecodeError as exc:
        raise ApiError(
            400, "invalid_request", f"request body is not valid JSON ({exc}); send a JSON object"
        ) from None
    except ValueError:  # Python refuses integers of more than 4,300 digits
        raise ApiError(
            400,
            "invalid_request",
            "request body holds a number of more than 4,300 digits; send numbers that fit "
            "the parameter",
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
    parsed = _to_parsed(req)
    if parsed.ignored:
        # As vLLM does: a warning, not a refusal. repr() keeps a hostile name on one line.
        names = ", ".join(repr(n[:40]) for n in parsed.ignored[:8])
        log.warning("request fields ignored (not supported here): %s", names)
    return parsed


def _ignored(req: ChatRequest | CompletionRequest) -> tuple[str, ...]:
    names = list(req.model_extra or ())
    if req.stream_options is not None:
        names += [f"stream_options.{n}" for n in req.stream_options.model_extra or ()]
    return tuple(names)


def _text(value: str, where: str) -> str:
    """Prompt text must be encodable: a lone surrogate (the JSON escape \\ud800) is valid
    JSON but no tokenizer takes it."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ApiError(
                400,
                "invalid_request",
                f"'{where}' holds an unpaired surrogate (\\u{ord(value[exc.start]):04x}) at "
                f"character {exc.start}; send valid Unicode text",
            ) from None
    return value


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
    if max_tokens is not None and req.min_tokens > max_tokens:
        raise ApiError(
            400,
            "invalid_request",
            f"min_tokens ({req.min_tokens}) is above max_tokens ({max_tokens}); lower min_tokens",
        )
    if isinstance(req, ChatRequest) and req.response_format not in (None, {"type": "text"}):
        raise ApiError(
            400,
            "invalid_request",
            "parameter 'response_format' other than {'type': 'text'} is not supported; remove it",
        )
    usage = bool(req.stream_options and req.stream_options.include_usage)
    parsed = ParsedRequest(
        kind="chat" if isinstance(req, ChatRequest) else "completion",
        model=req.model,
        stream=req.stream,
        include_usage=usage,
        continuous_usage=usage
        and bool(req.stream_options and req.stream_options.continuous_usage_stats),
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
        ignored=_ignored(req),
    )
    if isinstance(req, ChatRequest):
        parsed.messages = [
            (m.role, _text(m.text(), f"messages.{i}.content")) for i, m in enumerate(req.messages)
        ]
    elif isinstance(req.prompt, str):
        parsed.prompt_text = _text(req.prompt, "prompt")
    elif all(isinstance(p, str) for p in req.prompt):
        if len(req.prompt) != 1:
            raise ApiError(
                400,
                "invalid_request",
                f"'prompt' holds {len(req.prompt)} prompts; this server takes one per request",
            )
        parsed.prompt_text = _text(str(req.prompt[0]), "prompt")
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
