"""Everything the CreateOS HTTP API can do wrong, as one branch of the worker's error tree.

:func:`connection_error` and :func:`response_error` map an httpx failure or answer to one of
them (for :mod:`provider.createos.core`, which alone calls httpx). Messages are public (see
:mod:`provider.errors`): they name a fixed operation label such as
``"create sandbox"`` and, for status errors, the HTTP status. They never carry a response body,
a URL or the API key.

The tree of these classes is drawn once in ``docs/architecture.md``, section "Errors".
"""

from __future__ import annotations

import httpx

from provider.createos.retry import parse_retry_after
from provider.errors import ProviderError

_STATUS_HINTS = {
    400: "request rejected",
    401: "the API key was rejected",
    402: "payment required",
    403: "forbidden",
    404: "not found",
    408: "request timeout",
    409: "conflicting state",
    410: "output no longer available",
    413: "body too large",
    422: "request rejected",
    429: "rate limited",
}


class CreateOSError(ProviderError):
    """Base of every error raised by :mod:`provider.createos`."""


class APIStatusError(CreateOSError):
    """The API answered with an HTTP error status."""

    def __init__(
        self,
        operation: str,
        status: int,
        *,
        retry_after: float | None = None,
        message: str | None = None,
    ) -> None:
        if message is None:
            message = f"{status_text(operation, status)}."
        super().__init__(message)
        self.operation = operation
        self.status = status
        self.retry_after = retry_after

    @property
    def rejected(self) -> bool:
        """A status below 500 (429 included) or a 503: the server refused the request and did
        nothing, so even a create, fork or process start has a known outcome. Both official
        SDKs read a 503 this way ("no host with capacity, retry shortly")."""
        return self.status < 500 or self.status == 503


class AuthError(APIStatusError):
    """401 or 403: the key is missing, wrong, or not allowed to do this."""


class NotFound(APIStatusError):
    """404: the resource does not exist or belongs to another key."""


class Conflict(APIStatusError):
    """409: the resource is not in a state that allows the operation."""


class OutputEvicted(APIStatusError):
    """410 at connect, or the output_offset_expired frame: unread output was dropped."""


class RateLimited(APIStatusError):
    """429: too many requests; ``retry_after`` holds the server's hint when it sent one."""


class ServerError(APIStatusError):
    """A 5xx answer."""


class APIConnectionError(CreateOSError):
    """The request did not get a usable HTTP answer (transport failure, refused redirect)."""

    def __init__(self, operation: str, message: str) -> None:
        super().__init__(message)
        self.operation = operation


class APITimeout(APIConnectionError):
    """A connect, read, write or pool timeout of the HTTP transport."""


class APIProtocolError(CreateOSError):
    """The API answered something that breaks the protocol (envelope, payload, frame)."""


class InvalidIdentifier(APIProtocolError):
    """An id that does not match ``^[A-Za-z0-9_-]{1,200}$``; no request was made with it."""


class MalformedFrame(APIProtocolError):
    """An output-stream line that is not a valid frame."""


class StreamGap(APIProtocolError):
    """A data frame's seq skipped ahead: output was lost between frames."""


class StreamError(APIProtocolError):
    """The stream sent an error frame (other than output_offset_expired)."""


class MissingExitStatus(APIProtocolError):
    """An exit frame without an integer exit_code and without a SIG* signal."""


class ReconnectBudgetExhausted(APIProtocolError):
    """The output stream kept failing; it could not be followed to the process's exit."""


def status_text(operation: str, status: int) -> str:
    """``CreateOS <operation> failed: HTTP <status> (<hint>)``, the start of every status
    error's message (no final period)."""
    hint = _STATUS_HINTS.get(status, "server error" if status >= 500 else "")
    suffix = f" ({hint})" if hint else ""
    return f"CreateOS {operation} failed: HTTP {status}{suffix}"


def retry_refused(error: APIStatusError, wait: float, why: str) -> APIStatusError:
    """``error`` again, its message saying the server's ``Retry-After`` of ``wait`` seconds was
    not waited for and ``why`` (the status, operation and hint are kept)."""
    message = (
        f"{status_text(error.operation, error.status)}: the server asked to retry in "
        f"{wait:.0f} s, {why}."
    )
    return type(error)(
        error.operation, error.status, retry_after=error.retry_after, message=message
    )


def status_error(
    operation: str, status: int, *, retry_after: float | None = None
) -> APIStatusError:
    """The :class:`APIStatusError` subclass that matches ``status``."""
    cls: type[APIStatusError]
    if status in (401, 403):
        cls = AuthError
    elif status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status == 410:
        cls = OutputEvicted
    elif status == 429:
        cls = RateLimited
    elif status >= 500:
        cls = ServerError
    else:
        cls = APIStatusError
    return cls(operation, status, retry_after=retry_after)


def connection_error(operation: str, exc: httpx.RequestError) -> APIConnectionError:
    """Our error for an httpx transport failure (its class name only, never its text)."""
    kind = type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return APITimeout(operation, f"CreateOS {operation} failed: timed out ({kind}).")
    return APIConnectionError(operation, f"CreateOS {operation} failed: connection error ({kind}).")


def redirect_error(operation: str, status: int) -> APIConnectionError:
    return APIConnectionError(
        operation, f"CreateOS {operation} failed: redirect refused (HTTP {status})."
    )


def response_error(response: httpx.Response, operation: str) -> CreateOSError:
    """Our error for a non-2xx answer: a refused redirect, or the status's error class."""
    status = response.status_code
    if 300 <= status < 400:
        return redirect_error(operation, status)
    if status < 200 or status >= 300:
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        return status_error(operation, status, retry_after=retry_after)
    raise AssertionError("not an error status")  # pragma: no cover
