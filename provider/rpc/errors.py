"""The ONE place where exceptions become JSON-RPC errors, and the error the host can answer us.

:class:`provider.errors.InvalidParams` -> -32602 with its message; any other
:class:`provider.errors.ProviderError` -> -32002 with its (public) message; anything else ->
-32002 with a generic message naming the method, while the traceback goes to stderr (params are
never logged). The dispatcher also logs each such error once (a ``log`` notification at
:func:`failure_log_level`), so no failed request goes unrecorded in the worker's log.
"""

from __future__ import annotations

import sys
import traceback

from provider.errors import (
    ConfigError,
    InvalidParams,
    OperationCancelled,
    ProviderError,
    RequestRefused,
)
from provider.rpc import wire


def stderr_line(text: str) -> None:
    """One diagnostic line on stderr (the host logs each stderr line at warn level)."""
    try:
        sys.stderr.write(f"paperclip-createos: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _unwrap(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def error_for_exception(method: str, exc: Exception) -> tuple[int, str]:
    """The JSON-RPC (code, message) for an exception raised while serving ``method``."""
    leaf = _unwrap(exc)
    if isinstance(leaf, InvalidParams):
        return wire.INVALID_PARAMS, str(leaf)
    if isinstance(leaf, ProviderError):
        return wire.WORKER_ERROR, str(leaf)
    stderr_line(
        f"{method} failed with an unexpected error:\n"
        + "".join(traceback.format_exception(exc)).rstrip()
    )
    return wire.WORKER_ERROR, f"{method} failed: internal worker error (details in the worker log)"


def failure_log_level(exc: Exception) -> str:
    """The level a failed request is logged at: ``warn`` for a caller's mistake (a refused call,
    bad params or config) or work the host itself cancelled, ``error`` for everything else."""
    leaf = _unwrap(exc)
    caller = isinstance(leaf, RequestRefused | ConfigError | OperationCancelled)
    return "warn" if caller else "error"


class HostCallError(Exception):
    """The host answered one of our requests with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"host error {code}: {message}")
        self.code = code
        self.message = message
