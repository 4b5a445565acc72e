"""One call on the wire (DESIGN section 3): the request an agent sends and the responses a service streams back."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from .base import (
    describe_validation_error,
)


class ErrorBody(BaseModel):
    type: str
    message: str


class ToolServiceRequest(BaseModel):
    """What the agent sends; `config` and `arguments` are JSON text, per the spec."""

    user: str = ""
    config: str = "{}"
    arguments: str = "{}"


class ToolServiceResponse(BaseModel):
    error: ErrorBody | None = None
    response: str = ""
    end_of_stream: bool = True


def is_last_response(body: dict[str, Any]) -> bool:
    """A response ends its call when it says `end_of_stream`, or carries an error."""
    return bool(body.get("end_of_stream", True)) or bool(body.get("error"))


def response_chunk(body: dict[str, Any], service: str) -> str:
    """The text one response adds to the observation; `ToolError` if the service answered with an error."""
    from ..errors import ToolError

    try:
        response = ToolServiceResponse.model_validate(body)
    except ValidationError as exc:
        raise ToolError("bad-response", describe_validation_error(exc), service=service) from None
    if response.error is not None:
        raise ToolError(response.error.type, response.error.message, service=service)
    return response.response
