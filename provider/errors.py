"""The worker's one error tree.

Every exception the worker raises on purpose derives from :class:`ProviderError`. Its message is
*public*: it reaches Paperclip operators (HTTP 422 bodies, probe summaries, run logs), so it must
never contain an API key, a provider response body or a credential-bearing URL.
``provider.rpc.errors`` is the only place that turns exceptions into JSON-RPC errors: an
``InvalidParams`` becomes code -32602 (INVALID_PARAMS) and any other ``ProviderError`` -32002
(WORKER_ERROR), each with its message; anything else becomes -32002 with a generic message (the
traceback goes to stderr only).

The whole tree, with the code and log level each class gets, is drawn once in
``docs/architecture.md``, section "Errors" (``tests/test_error_tree.py`` pins it).
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
