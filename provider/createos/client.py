"""The CreateOS Sandbox HTTP API client (docs/protocol.md C1-C7).

:class:`CreateOSClient` is composed of one mixin per resource over a shared request core:

- :mod:`provider.createos.core`: :class:`~provider.createos.core.ClientCore` (the connection
  pool, :func:`new_http_client`, timeouts), pacing, retries and error mapping. It is the one
  place where httpx exceptions become :mod:`provider.createos.errors`. Every request attempt,
  retries and stream opens included, first waits for its turn at the origin's
  :class:`~provider.createos.pacer.RequestPacer`. Redirects are never followed.
- :mod:`provider.createos.sandboxes`: create, read, list, delete, pause, resume, patch, fork,
  egress, exec.
- :mod:`provider.createos.processes`: managed processes, their stdin and the output stream.
- :mod:`provider.createos.exec_stream`: the streaming exec (one request per command).
- :mod:`provider.createos.files`: upload and download of one file.

New resources get a module and a mixin of their own, added to the bases.

Retries (details in :mod:`provider.createos.core`): GET, DELETE, PUT of a replayable body and PATCH
(absolute values) are retried on transport errors and HTTP 408, 429, 500, 502, 503, 504; POST only
on 429 and 503 (the server did not process it), which also holds for sandbox creation, fork and
process creation. At most ``max_retries`` extra attempts, ``Retry-After`` first, otherwise an
exponential backoff with jitter; a wait that would pass the caller's anyio deadline is not started.
The output stream (``connect``) is never retried here (its reader reconnects); a download
(``get_file``) is retried only while opening, never once its body has started.

The names other modules import from here (constants included) are re-exported, so callers need
not know which module holds them.
"""

from __future__ import annotations

from provider.createos.core import (
    DEFAULT_TIMEOUT,
    FILE_TIMEOUT,
    HTTP11_READ_BYTES,
    STREAM_TIMEOUT,
    USER_AGENT,
    new_http_client,
)
from provider.createos.exec_stream import ExecStreamCalls
from provider.createos.files import FileCalls
from provider.createos.processes import MAX_INPUT_BYTES, ProcessCalls
from provider.createos.retry import MAX_RETRY_AFTER
from provider.createos.sandboxes import LIST_PAGE, SandboxCalls
from provider.createos.upload import UPLOAD_CHUNK

__all__ = [
    "DEFAULT_TIMEOUT",
    "FILE_TIMEOUT",
    "HTTP11_READ_BYTES",
    "LIST_PAGE",
    "MAX_INPUT_BYTES",
    "MAX_RETRY_AFTER",
    "STREAM_TIMEOUT",
    "UPLOAD_CHUNK",
    "USER_AGENT",
    "CreateOSClient",
    "new_http_client",
]


class CreateOSClient(ExecStreamCalls, SandboxCalls, ProcessCalls, FileCalls):
    """Typed calls of the CreateOS API for one origin and key (see the module docstring).

    Construction, ``aclose`` and ``async with`` come from
    :class:`~provider.createos.core.ClientCore`; each base adds one resource's calls.
    """
