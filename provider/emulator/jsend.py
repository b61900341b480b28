"""JSend envelopes as HTTP responses (``success`` / ``fail`` / ``error``)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from .http_messages import Response

_encoder = msgspec.json.Encoder()


def json_response(
    status: int, payload: Any, headers: list[tuple[str, str]] | None = None
) -> Response:
    return Response(status, _encoder.encode(payload), headers=list(headers or []))


def ok(data: Any, status: int = 200, headers: list[tuple[str, str]] | None = None) -> Response:
    return json_response(status, {"status": "success", "data": data}, headers)


def fail(status: int, data: Any, headers: list[tuple[str, str]] | None = None) -> Response:
    return json_response(status, {"status": "fail", "data": data}, headers)


def error(status: int, message: str, code: int | None = None) -> Response:
    return json_response(status, {"status": "error", "message": message, "code": code or status})


def default_for(status: int) -> Response:
    """The envelope a fault answers when no body was given."""
    if status >= 500:
        return error(status, "injected server error")
    if status < 400:
        return ok({}, status)
    return fail(status, {"fault": "injected failure"})


def no_such_route() -> ApiError:
    """A path no route serves (also a streamed exec on an "older server", see settings)."""
    return ApiError(404, {"path": "no such route"})


class ApiError(Exception):
    """Raised by handlers to answer a fail/error envelope."""

    def __init__(
        self, status: int, data: Any, headers: list[tuple[str, str]] | None = None
    ) -> None:
        super().__init__(status)
        self.status = status
        self.data = data
        self.headers = headers or []

    def response(self) -> Response:
        if self.status >= 500:
            return error(self.status, str(self.data))
        return fail(self.status, self.data, self.headers)


def not_found(what: str = "sandbox") -> ApiError:
    return ApiError(404, {what: f"{what} not found"})


def conflict(message: str) -> ApiError:
    return ApiError(409, {"state": message})


def bad_request(field: str, message: str) -> ApiError:
    return ApiError(400, {field: message})


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, else a 400 naming the body."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise bad_request("body", "body is not valid JSON") from exc
    if not isinstance(value, dict):
        raise bad_request("body", "body must be a JSON object")
    return value
