"""One call on the wire (DESIGN section 3): the request an agent sends and the responses a service streams back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from json.encoder import encode_basestring as _string
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from ..errors import ToolError
from .base import (
    describe_validation_error,
)
from .content import ContentBlock, TextContent, ToolResult


class ErrorBody(BaseModel):
    type: str
    message: str


class ToolServiceRequest(BaseModel):
    """What the agent sends; `config` and `arguments` are JSON text, per the spec."""

    user: str = ""
    config: str = "{}"
    arguments: str = "{}"


def request_fields(data: bytes) -> tuple[str, str, str]:
    """A request's `user`, `config` and `arguments` (the latter two JSON text), as
    `ToolServiceRequest.model_validate_json(data)` reads them, and its `ValidationError` for what it refuses.

    A plain request (UTF-8 with no surrogate escape anywhere, a JSON object whose fields are strings: what every
    caller sends, unless it sends characters past U+FFFF) is read by the json module alone; anything else goes to
    the model, which has the last word and the message. (A service reads one per call, and the model's validator
    is one more library to bring back into the processor's cache after every wait.)
    """
    found = None
    if b"\\ud" not in data and b"\\uD" not in data:  # the model refuses half a pair anywhere
        try:
            found = json.loads(data.decode())
        except (ValueError, RecursionError):  # not UTF-8, not JSON: the model says so
            pass
    if type(found) is dict:
        fields = (found.get("user", ""), found.get("config", "{}"), found.get("arguments", "{}"))
        if type(fields[0]) is str and type(fields[1]) is str and type(fields[2]) is str:
            return fields
    request = ToolServiceRequest.model_validate_json(data)
    return request.user, request.config, request.arguments


def request_bytes(user: str, config: Mapping[str, Any], arguments: Mapping[str, Any]) -> bytes:
    """A `ToolServiceRequest` as it goes on the wire: the bytes `encode(ToolServiceRequest(...))` gives, without
    building the model on every call (each field a JSON string, spelled by the json module's own string encoder).
    TypeError or ValueError for what JSON cannot carry."""
    if not isinstance(user, str):
        raise TypeError(f"user must be a string, not {type(user).__name__}")
    # A tool without config values sends `{}` on every call: spelled here, not encoded each time.
    config_text = "{}" if config == {} else json.dumps(dict(config))
    arguments_text = "{}" if arguments == {} else json.dumps(dict(arguments))
    return f'{{"user":{_string(user)},"config":{_string(config_text)},"arguments":{_string(arguments_text)}}}'.encode()


def text_response_bytes(text: str) -> bytes:
    """A last response carrying `text` as it goes on the wire: the bytes `encode(ToolServiceResponse(response=text))`
    gives, without the model (a service answers most calls so)."""
    return f'{{"response":{_string(text)},"end_of_stream":true}}'.encode()


class ToolServiceResponse(BaseModel):
    """One response. `content` and `structured` are left off (not sent as null) when a result is text only, so a
    text answer is the bytes it always was; readers that do not know them (TrustGraph's) read `response`."""

    error: ErrorBody | None = None
    response: str = ""
    end_of_stream: bool = True
    content: list[ContentBlock] | None = None
    structured: dict[str, Any] | None = None

    @classmethod
    def of_result(cls, result: ToolResult, *, end_of_stream: bool = True) -> ToolServiceResponse:
        """A rich result: its blocks and structured content, and its text rendering in `response`."""
        return cls(
            response=result.text,
            content=list(result.content) if result.content else None,
            structured=result.structured,
            end_of_stream=end_of_stream,
        )

    def result(self) -> ToolResult:
        """What this response adds to the call's result: its blocks, or its text as one text block."""
        if self.content is None and self.structured is None:
            return ToolResult(content=(TextContent(text=self.response),)) if self.response else ToolResult()
        return ToolResult(content=tuple(self.content or ()), structured=self.structured)


def is_last_response(body: dict[str, Any]) -> bool:
    """A response ends its call when it says `end_of_stream`, or carries an error."""
    return bool(body.get("end_of_stream", True)) or bool(body.get("error"))


def parse_response(body: dict[str, Any], service: str) -> ToolServiceResponse:
    """One response, checked; `ToolError` if the service answered with an error or with something that is not a
    response (a content block that is not one, say)."""
    try:
        response = ToolServiceResponse.model_validate(body)
    except ValidationError as exc:
        raise ToolError("bad-response", describe_validation_error(exc), service=service) from None
    if response.error is not None:
        raise ToolError(response.error.type, response.error.message, service=service)
    return response


_PLAIN_KEYS = frozenset({"response", "end_of_stream"})


def plain_text(body: dict[str, Any]) -> str | None:
    """The text of a response that is text and nothing else (`{"response": ..., "end_of_stream": ...}`, what most
    calls are answered with), as `parse_response(body).response` reads it, without building the model; None for
    any other response (an error, content blocks, a field to coerce), which `parse_response` reads."""
    if body.keys() <= _PLAIN_KEYS:
        text = body.get("response", "")
        if type(text) is str and type(body.get("end_of_stream", True)) is bool:
            return text
    return None


def response_chunk(body: dict[str, Any], service: str) -> str:
    """The text one response adds to the observation; `ToolError` if the service answered with an error."""
    return parse_response(body, service).response
