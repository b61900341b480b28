"""The worker's one error tree.

Every exception the worker raises on purpose derives from :class:`ProviderError`. Its message is
*public*: it reaches Paperclip operators (HTTP 422 bodies, probe summaries, run logs), so it must
never contain an API key, a provider response body or a credential-bearing URL. The JSON-RPC
dispatcher (``provider.rpc.dispatcher``) is the only place that turns exceptions into JSON-RPC
errors: a ``ProviderError`` becomes code -32002 (WORKER_ERROR) with its message; anything else
becomes -32002 with a generic message (the traceback goes to stderr only).

::

    ProviderError
    ├── ConfigError                 environment config invalid (field named, fix stated)
    ├── RequestRefused              call refused before any side effect (foreign lease, lease
    │   │                           closing, worker shutting down, unconfined path, ...)
    │   ├── InvalidParams           params missing, not an object or of the wrong type (-32602)
    │   └── LeaseGone               the lease's sandbox was deleted (zero requests spent on it)
    ├── RateLimitQueued             the deadline passed in the rate-limit queue; nothing was sent
    ├── OperationCancelled          work cancelled by release / destroy / shutdown
    ├── CleanupUnconfirmed          a remote process (or sandbox) may still exist; lease poisoned
    ├── TransferError               file sync failed (download cut, archive refused, command failed)
    └── CreateOSError               provider.createos.errors: everything the HTTP API can do wrong
        ├── APIStatusError          an HTTP status (status, operation)
        │   ├── NotFound            404 (unknown *or foreign* resource)
        │   ├── Conflict            409
        │   ├── OutputEvicted       410 (process journal dropped unread output)
        │   ├── RateLimited         429
        │   └── ServerError         5xx
        ├── APIConnectionError      transport failure, redirect, read timeout
        └── APIProtocolError        malformed envelope, invalid id, bad stream frame
"""

from __future__ import annotations


class ProviderError(Exception):
    """Base of every deliberate worker error. ``str(exc)`` is safe to show to operators."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(ProviderError):
    """The environment config is invalid. The message names the field and how to fix it."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class RequestRefused(ProviderError):
    """The call was refused before any side effect (no HTTP request was made)."""


class InvalidParams(RequestRefused):
    """The request's params are missing, not an object, or a field has the wrong type."""


class LeaseGone(RequestRefused):
    """The lease's sandbox was released, destroyed or answered 404: refused without a request."""


class RateLimitQueued(ProviderError):
    """A deadline passed while the request waited for its turn in the rate-limit queue (or for
    a retry the server asked for): nothing was sent, so nothing needs cleaning up."""


class OperationCancelled(ProviderError):
    """Active work was cancelled by a release, a destroy or the worker shutting down."""


class CleanupUnconfirmed(ProviderError):
    """A remote process tree or sandbox may still be running; the lease must be destroyed."""


class TransferError(ProviderError):
    """A file transfer failed; the host target was left as it was."""
