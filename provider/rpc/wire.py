"""JSON-RPC 2.0 wire format: codes, UTF-8 encoding, decoding and classification by shape.

One JSON text per line each way. Outgoing lines are UTF-8 JSON as msgspec writes it: non-ASCII
text goes out as its UTF-8 bytes, not as ``\\uXXXX`` escapes, because the host's line reader
(node:readline on the worker's stdout) decodes UTF-8 and counts its line limit in UTF-16 units
after decoding: an escaped character costs 6 (12 for one above U+FFFF) of those units and six
to twelve bytes of pipe, its UTF-8 form one or two units and two to four bytes. Nothing depends
on the worker's locale either way (bytes are written, never text). Control characters, ``"``
and ``\\`` are escaped, so CR and LF never occur inside a line. msgspec refuses lone
surrogates (``UnicodeEncodeError``), so a line is always valid UTF-8.
Incoming lines are decoded with msgspec, then classified by *shape*, never by id value.

A lone UTF-16 surrogate escape (``"\\ud83d"``: Node writes one for an emoji cut in half) is not
valid Unicode and msgspec refuses the line. Answering that with a parse error (id null) would
leave the host waiting for its own timeout, so such a line is decoded again with the standard
library, which keeps each lone surrogate as a code point: a request is then marked
``lone_surrogates`` and the dispatcher answers it under its id (refused, or passed to a policy
that the composition root gives). In a response to one of our own requests each lone surrogate
becomes U+FFFD.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import msgspec

from provider.surrogates import holds_lone_surrogate, replace_lone_surrogates

JSONRPC_VERSION: Final = "2.0"

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
WORKER_UNAVAILABLE: Final = -32000
CAPABILITY_DENIED: Final = -32001
WORKER_ERROR: Final = -32002
TIMEOUT: Final = -32003
METHOD_NOT_IMPLEMENTED: Final = -32004
INVOCATION_SCOPE_DENIED: Final = -32005

RequestId = int | str


_encoder: Final = msgspec.json.Encoder()


def encode_line(message: Any) -> bytes:
    """One message as a UTF-8 JSON line ending in ``\\n`` (no other CR or LF in it).

    Raises ``TypeError``/``ValueError``/``UnicodeEncodeError`` when the message holds something
    JSON cannot carry (an unsupported type, a lone surrogate).
    """
    return _encoder.encode(message) + b"\n"


# --- incoming messages -----------------------------------------------------------------------


class Request(msgspec.Struct, frozen=True):
    """A request from the host (it has an id and expects one response)."""

    id: RequestId
    method: str
    params: Any  # validated by the dispatcher: must be an object
    has_params: bool
    invocation_id: str | None
    lone_surrogates: bool = False  # some string of the request holds one (module docstring)


class Notification(msgspec.Struct, frozen=True):
    """A notification from the host (no id, no response)."""

    method: str
    params: Any


class Response(msgspec.Struct, frozen=True):
    """A response to one of our own requests (``error`` is the error object, if any)."""

    id: RequestId
    result: Any
    error: dict[str, Any] | None


class Invalid(msgspec.Struct, frozen=True):
    """A line that is not a usable message; ``code`` says which JSON-RPC error to answer."""

    code: int
    message: str
    id: RequestId | None


Message = Request | Notification | Response | Invalid


_BAD_ID: Final = 'Invalid Request: "id" must be a number or a string'


def _is_id(value: object) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)


def _invocation_id(raw: dict[str, Any]) -> str | None:
    context = raw.get("paperclipInvocation")
    if isinstance(context, dict):
        inv_id = context.get("id")
        if isinstance(inv_id, str) and inv_id:
            return inv_id
    return None


def classify(raw: object) -> Message:
    """Classify one decoded JSON value by its shape."""
    if not isinstance(raw, dict):
        return Invalid(INVALID_REQUEST, "Invalid Request: expected a JSON object", None)
    raw_id = raw.get("id")
    reply_id = raw_id if _is_id(raw_id) else None
    if raw.get("jsonrpc") != JSONRPC_VERSION:
        return Invalid(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"', reply_id)
    if "method" in raw:
        method = raw["method"]
        if not isinstance(method, str) or not method:
            return Invalid(INVALID_REQUEST, 'Invalid Request: "method" must be a string', reply_id)
        if "id" not in raw:
            return Notification(method, raw.get("params"))
        if reply_id is None:
            return Invalid(
                INVALID_REQUEST, 'Invalid Request: "id" must be a number or string', None
            )
        return Request(reply_id, method, raw.get("params"), "params" in raw, _invocation_id(raw))
    if "result" in raw or "error" in raw:
        if reply_id is None:
            return Invalid(INVALID_REQUEST, "Invalid Request: response without a usable id", None)
        error = raw.get("error")
        if error is not None and not isinstance(error, dict):
            return Invalid(INVALID_REQUEST, 'Invalid Request: "error" must be an object', None)
        return Response(reply_id, raw.get("result"), error)
    return Invalid(INVALID_REQUEST, "Invalid Request: neither a request nor a response", reply_id)


_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")


def _decode_with_lone_surrogates(line: bytes) -> Message | None:
    """The message of a line msgspec refused, when a lone surrogate escape is why; else None."""
    if _SURROGATE_ESCAPE.search(line) is None:
        return None
    try:
        # Strict UTF-8 first: json.loads would let encoded surrogates (ED A0 80) through.
        raw = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        return None
    if not holds_lone_surrogate(raw):
        return None  # refused for another reason after all
    message = classify(raw)
    if isinstance(message, Request):
        if holds_lone_surrogate(message.id):
            return None  # no reply can carry that id (every line we write is valid UTF-8)
        if holds_lone_surrogate(message.method):
            return Invalid(METHOD_NOT_FOUND, _BROKEN_METHOD, message.id)
        invocation = message.invocation_id
        return msgspec.structs.replace(
            message,
            lone_surrogates=True,
            invocation_id=None if holds_lone_surrogate(invocation) else invocation,
        )
    if isinstance(message, Response):
        return msgspec.structs.replace(
            message,
            result=replace_lone_surrogates(message.result),
            error=replace_lone_surrogates(message.error),
        )
    if isinstance(message, Notification):
        return message  # ignored by the dispatcher either way
    return Invalid(message.code, message.message, _answerable(message.id))


_BROKEN_METHOD: Final = "Method not found: the method name holds a lone UTF-16 surrogate"


def _answerable(request_id: RequestId | None) -> RequestId | None:
    return None if holds_lone_surrogate(request_id) else request_id


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity, which msgspec refuses too


def decode_line(line: bytes) -> Message:
    """Decode and classify one incoming line (without its line terminator)."""
    try:
        raw = msgspec.json.decode(line)
    except msgspec.DecodeError:
        recovered = _decode_with_lone_surrogates(line)
        if recovered is not None:
            return recovered
        return Invalid(PARSE_ERROR, "Parse error: line is not valid JSON", None)
    except RecursionError:  # nesting deeper than the interpreter's recursion limit
        return Invalid(PARSE_ERROR, "Parse error: JSON nested too deeply", None)
    return classify(raw)


# --- outgoing messages -----------------------------------------------------------------------


def result_message(request_id: RequestId, result: Any) -> dict[str, Any]:
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "result": result}


def error_message(
    request_id: RequestId | None, code: int, message: str, data: Any = None
) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "error": error}


def notification_message(
    method: str, params: dict[str, Any], invocation_id: str | None
) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": JSONRPC_VERSION, "method": method, "params": params}
    if invocation_id is not None:
        message["paperclipInvocationId"] = invocation_id
    return message


def request_message(
    request_id: RequestId, method: str, params: dict[str, Any], invocation_id: str | None
) -> dict[str, Any]:
    message = notification_message(method, params, invocation_id)
    message["id"] = request_id
    return message
