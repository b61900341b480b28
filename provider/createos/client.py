"""The CreateOS Sandbox HTTP API client (createos-api.md sections 1-7).

The one place where httpx exceptions become :mod:`provider.createos.errors`. Every request
attempt, retries and stream opens included, first waits for its turn at the origin's
:class:`~provider.createos.pacer.RequestPacer`. Redirects are never followed.

Retries (createos-api.md 1.8, "Our policy"): GET, DELETE and PUT of a replayable body are
retried on transport errors and HTTP 408, 429, 500, 502, 503, 504; POST only on 429 (the server
provably did nothing), which also holds for sandbox and process creation. At most
``max_retries`` extra attempts, ``Retry-After`` (seconds or an HTTP date) first, otherwise
``min(backoff_base * 2**n + U(0, backoff_base), 30)`` seconds. A wait that would pass the
caller's anyio deadline is not started: the error is raised at once. The output stream
(``connect``) is never retried here (its reader reconnects); a download (``get_file``) is
retried only while opening, never once its body has started.
"""

from __future__ import annotations

import importlib.metadata
import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Final
from urllib.parse import quote

import anyio
import anyio.lowlevel
import httpcore
import httpx

from provider.createos.envelope import list_page, unwrap_success
from provider.createos.errors import (
    APIConnectionError,
    APIProtocolError,
    APIStatusError,
    APITimeout,
    CreateOSError,
    status_error,
)
from provider.createos.models import (
    ExecResult,
    ProcessView,
    SandboxView,
    exec_result,
    is_valid_id,
    process_view,
    require_id,
    sandbox_view,
)
from provider.createos.pacer import RequestPacer, pacer_for
from provider.createos.retry import backoff_delay, parse_retry_after
from provider.createos.upload import UPLOAD_CHUNK, UploadBody

__all__ = ["UPLOAD_CHUNK", "CreateOSClient"]

try:
    _VERSION = importlib.metadata.version("paperclip-plugin-createos")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
    _VERSION = "0"

USER_AGENT: Final = f"paperclip-plugin-createos/{_VERSION} python-httpx/{httpx.__version__}"
DEFAULT_TIMEOUT: Final = httpx.Timeout(connect=10.0, read=120.0, write=60.0, pool=10.0)
STREAM_TIMEOUT: Final = httpx.Timeout(connect=10.0, read=30.0, write=30.0, pool=10.0)
"""Streams: heartbeats arrive every 5 s, so 30 s without a byte means the stream is dead."""
FILE_TIMEOUT: Final = httpx.Timeout(connect=10.0, read=60.0, write=60.0, pool=10.0)
MAX_RETRY_AFTER: Final = 60.0
"""A Retry-After longer than this is not waited for: the error is raised with the hint."""
LIST_PAGE: Final = 100
_MAX_PAGES: Final = 10_000

HTTP11_READ_BYTES: Final = 256 * 1024


def _widen_http11_reads() -> None:
    """Read responses 256 KiB at a time instead of httpcore's 64 KiB.

    The asyncio transport receives up to 256 KiB per ``recv``; 64 KiB reads split each of those
    into four (copying the rest every time) and run the h11/httpcore/httpx layers four times.
    On the output stream and downloads this costs about a fifth of the worker's CPU per byte
    (bench/execute_relay.py). httpcore has no option for it, so the class default is raised once;
    a httpcore without that attribute (or with another default) is left as it is.
    """
    connection = getattr(httpcore, "AsyncHTTP11Connection", None)
    if connection is not None and getattr(connection, "READ_NUM_BYTES", None) == 64 * 1024:
        connection.READ_NUM_BYTES = HTTP11_READ_BYTES


_widen_http11_reads()

_IDEMPOTENT_RETRY: Final = frozenset({408, 429, 500, 502, 503, 504})
_POST_RETRY: Final = frozenset({429})
_PATH_SAFE: Final = "!~*'()"  # encodeURIComponent leaves these (and A-Z a-z 0-9 - _ .) alone


async def _sleep(seconds: float) -> None:
    """The wait between attempts (a seam for tests)."""
    await anyio.sleep(seconds)


def _connection_error(operation: str, exc: httpx.RequestError) -> APIConnectionError:
    kind = type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return APITimeout(operation, f"CreateOS {operation} failed: timed out ({kind}).")
    return APIConnectionError(operation, f"CreateOS {operation} failed: connection error ({kind}).")


def _redirect_error(operation: str, status: int) -> APIConnectionError:
    return APIConnectionError(
        operation, f"CreateOS {operation} failed: redirect refused (HTTP {status})."
    )


def _error_for(response: httpx.Response, operation: str) -> CreateOSError:
    status = response.status_code
    if 300 <= status < 400:
        return _redirect_error(operation, status)
    if status < 200 or status >= 300:
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        return status_error(operation, status, retry_after=retry_after)
    raise AssertionError("not an error status")  # pragma: no cover


def _file_url(sandbox_id: str, path: str) -> str:
    if not isinstance(path, str) or not path:
        raise ValueError("a sandbox file path must be a non-empty string")
    return f"/sandboxes/{sandbox_id}/files?path={quote(path, safe=_PATH_SAFE)}"


class _Body:
    """A response body as an async iterator of bytes; transport errors become ours."""

    def __init__(self, response: httpx.Response, operation: str) -> None:
        self._chunks = response.aiter_bytes()
        self._operation = operation

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except httpx.RequestError as exc:
            raise _connection_error(self._operation, exc) from exc

    async def aclose(self) -> None:
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()


class CreateOSClient:
    """Typed calls of the CreateOS API for one origin and key (see the module docstring)."""

    def __init__(
        self,
        origin: str,
        api_key: str,
        *,
        pacer: RequestPacer | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_retries: int = 2,
        backoff_base: float = 0.5,
    ) -> None:
        self.origin = origin.rstrip("/")
        self._pacer = pacer if pacer is not None else pacer_for(self.origin)
        self._max_retries = max(0, max_retries)
        self._backoff_base = backoff_base
        self._http = httpx.AsyncClient(
            base_url=self.origin + "/v1",
            headers={
                "X-Api-Key": api_key,
                "Accept": "application/json",
                "User-Agent": USER_AGENT,
            },
            follow_redirects=False,
            timeout=DEFAULT_TIMEOUT,
            transport=transport,
        )

    async def __aenter__(self) -> CreateOSClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    # ------------------------------------------------------------------ request core

    async def _call(
        self,
        method: str,
        url: str,
        *,
        operation: str,
        retry_on: frozenset[int],
        retry_transport: bool,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        upload: Callable[[], UploadBody] | None = None,
        headers: Mapping[str, str] | None = None,
        limits: httpx.Timeout = DEFAULT_TIMEOUT,
    ) -> httpx.Response:
        """Send with pacing and retries; return the 2xx response or raise our error."""
        attempt = 0
        while True:
            await self._pacer.wait_turn()
            body = upload() if upload is not None else None
            cause: httpx.RequestError | None = None
            try:
                response = await self._http.request(
                    method,
                    url,
                    params=params,
                    json=json,
                    content=body,
                    headers=headers,
                    timeout=limits,
                )
            except httpx.RequestError as exc:
                cause = exc
                error: CreateOSError = _connection_error(operation, exc)
                retryable = retry_transport
                retry_after = None
            else:
                if 200 <= response.status_code < 300:
                    return response
                error = _error_for(response, operation)
                retryable = isinstance(error, APIStatusError) and error.status in retry_on
                retry_after = error.retry_after if isinstance(error, APIStatusError) else None
            finally:
                if body is not None:
                    body.close()
            if retryable and await self._backoff(attempt, retry_after):
                attempt += 1
                continue
            if cause is not None:
                raise error from cause
            raise error

    async def _backoff(self, attempt: int, retry_after: float | None) -> bool:
        """Wait before retry ``attempt + 1``; False when no retry is left or the wait would
        pass ``MAX_RETRY_AFTER`` or the caller's deadline (the error is then raised)."""
        if attempt >= self._max_retries:
            return False
        await anyio.lowlevel.checkpoint_if_cancelled()  # a cancel wins over the error
        delay = backoff_delay(attempt, self._backoff_base, retry_after, jitter=random.uniform)
        if delay > MAX_RETRY_AFTER or not _fits_deadline(delay):
            return False
        await _sleep(delay)
        return True

    async def _json_call(
        self,
        method: str,
        url: str,
        *,
        operation: str,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
    ) -> Any:
        idempotent = method in ("GET", "DELETE", "PUT")
        response = await self._call(
            method,
            url,
            operation=operation,
            retry_on=_IDEMPOTENT_RETRY if idempotent else _POST_RETRY,
            retry_transport=idempotent,
            params=params,
            json=json,
        )
        return unwrap_success(response.status_code, response.content, operation)

    @asynccontextmanager
    async def _stream(
        self,
        url: str,
        *,
        operation: str,
        accept: str,
        params: Mapping[str, str | int] | None = None,
        limits: httpx.Timeout,
        retry_open: bool = False,
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """A streamed GET. With ``retry_open``, opening it (up to the response head) is retried
        like any idempotent request; a body cut once it has started is never retried here."""
        attempt = 0
        while True:
            await self._pacer.wait_turn()
            request = self._http.build_request(
                "GET", url, params=params, headers={"Accept": accept}, timeout=limits
            )
            cause: httpx.RequestError | None = None
            retry_after: float | None = None
            error: CreateOSError
            try:
                response = await self._http.send(request, stream=True)
            except httpx.RequestError as exc:
                cause, error = exc, _connection_error(operation, exc)
                retryable = retry_open
            else:
                if 200 <= response.status_code < 300:
                    break
                await response.aclose()
                error = _error_for(response, operation)
                retryable = retry_open and (
                    isinstance(error, APIStatusError) and error.status in _IDEMPOTENT_RETRY
                )
                retry_after = error.retry_after if isinstance(error, APIStatusError) else None
            if retryable and await self._backoff(attempt, retry_after):
                attempt += 1
                continue
            if cause is not None:
                raise error from cause
            raise error
        try:
            body = _Body(response, operation)
            try:
                yield body
            finally:
                await body.aclose()
        finally:
            await response.aclose()

    # ------------------------------------------------------------------ sandboxes

    async def create_sandbox(
        self, *, shape: str, name: str, rootfs: str | None, region: str | None
    ) -> str:
        """``POST /sandboxes``; returns the new id. Retried only on 429."""
        body: dict[str, Any] = {"shape": shape, "name": name}
        if rootfs is not None:
            body["rootfs"] = rootfs
        if region is not None:
            body["region"] = region
        body["ingress_enabled"] = False
        operation = "create sandbox"
        data = await self._json_call("POST", "/sandboxes", operation=operation, json=body)
        sandbox_id = data.get("id") if isinstance(data, dict) else None
        if not is_valid_id(sandbox_id):
            raise APIProtocolError(f"CreateOS {operation} answered without a valid sandbox id.")
        assert isinstance(sandbox_id, str)
        return sandbox_id

    async def get_sandbox(self, sandbox_id: str) -> SandboxView:
        """``GET /sandboxes/{id}``; the answer must be about that sandbox."""
        operation = "read sandbox"
        require_id(sandbox_id, "sandbox")
        data = await self._json_call("GET", f"/sandboxes/{sandbox_id}", operation=operation)
        view = sandbox_view(data, operation)
        if view.id != sandbox_id:
            raise APIProtocolError(f"CreateOS {operation} answered for another sandbox.")
        return view

    async def list_sandboxes(self, *, status: str | None = None) -> list[SandboxView]:
        """Every sandbox of this key (all pages), optionally filtered by status."""
        operation = "list sandboxes"
        views: list[SandboxView] = []
        offset = 0
        for _ in range(_MAX_PAGES):
            params: dict[str, str | int] = {"limit": LIST_PAGE, "offset": offset}
            if status is not None:
                params["status"] = status
            data = await self._json_call("GET", "/sandboxes", operation=operation, params=params)
            items, total = list_page(data, operation)
            views.extend(sandbox_view(item, operation) for item in items)
            offset += len(items)
            if total is None or not items or offset >= total:
                return views
        raise APIProtocolError(f"CreateOS {operation} did not reach the end of its pages.")

    async def delete_sandbox(self, sandbox_id: str) -> str:
        """``DELETE /sandboxes/{id}``; returns the answered status. 404 raises NotFound."""
        operation = "delete sandbox"
        require_id(sandbox_id, "sandbox")
        data = await self._json_call("DELETE", f"/sandboxes/{sandbox_id}", operation=operation)
        if not isinstance(data, dict) or not isinstance(data.get("status"), str):
            raise APIProtocolError(f"CreateOS {operation} answered without a status.")
        if "id" in data and data["id"] != sandbox_id:
            raise APIProtocolError(f"CreateOS {operation} answered for another sandbox.")
        status: str = data["status"]
        return status

    async def pause_sandbox(self, sandbox_id: str) -> None:
        """``POST /sandboxes/{id}/pause`` (202 or 200); 409 raises Conflict."""
        require_id(sandbox_id, "sandbox")
        await self._json_call("POST", f"/sandboxes/{sandbox_id}/pause", operation="pause sandbox")

    async def resume_sandbox(self, sandbox_id: str) -> None:
        """``POST /sandboxes/{id}/resume`` (202 or 200); 409 raises Conflict."""
        require_id(sandbox_id, "sandbox")
        await self._json_call("POST", f"/sandboxes/{sandbox_id}/resume", operation="resume sandbox")

    async def exec(
        self, sandbox_id: str, cmd: str, args: Sequence[str], *, stdin: str | None = None
    ) -> ExecResult:
        """Buffered ``POST /sandboxes/{id}/exec``: runs ``cmd`` + ``args`` (no shell)."""
        operation = "run command"
        require_id(sandbox_id, "sandbox")
        body: dict[str, Any] = {"cmd": cmd, "args": list(args)}
        if stdin is not None:
            body["stdin"] = stdin
        data = await self._json_call(
            "POST", f"/sandboxes/{sandbox_id}/exec", operation=operation, json=body
        )
        return exec_result(data, operation)

    # ------------------------------------------------------------------ processes

    async def create_process(
        self, sandbox_id: str, *, cmd: str, args: Sequence[str], cwd: str | None = None
    ) -> ProcessView:
        """``POST .../processes``. Repeated only on 429; any other failure is raised once."""
        operation = "start process"
        require_id(sandbox_id, "sandbox")
        body: dict[str, Any] = {"cmd": cmd, "args": list(args)}
        if cwd is not None:
            body["cwd"] = cwd
        data = await self._json_call(
            "POST", f"/sandboxes/{sandbox_id}/processes", operation=operation, json=body
        )
        return process_view(data, operation)

    async def get_process(self, sandbox_id: str, process_id: str) -> ProcessView:
        """``GET .../processes/{pid}``."""
        operation = "read process"
        url = self._process_url(sandbox_id, process_id)
        view = process_view(await self._json_call("GET", url, operation=operation), operation)
        if view.process_id != process_id:
            raise APIProtocolError(f"CreateOS {operation} answered for another process.")
        return view

    async def delete_process(
        self, sandbox_id: str, process_id: str, *, grace_ms: int = 1000
    ) -> ProcessView:
        """``DELETE .../processes/{pid}?grace_ms=``: kills the tree; answers once it is gone."""
        operation = "kill process"
        if isinstance(grace_ms, bool) or not isinstance(grace_ms, int) or grace_ms < 0:
            raise ValueError("grace_ms must be a non-negative integer")
        url = self._process_url(sandbox_id, process_id)
        data = await self._json_call(
            "DELETE", url, operation=operation, params={"grace_ms": grace_ms}
        )
        return process_view(data, operation)

    async def close_stdin(self, sandbox_id: str, process_id: str) -> None:
        """``POST .../processes/{pid}/stdin/close``; 409 (already closed) raises Conflict."""
        url = self._process_url(sandbox_id, process_id) + "/stdin/close"
        await self._json_call("POST", url, operation="close process stdin")

    def connect(
        self, sandbox_id: str, process_id: str, *, after: int
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """``GET .../connect?after=N`` as raw NDJSON body chunks (not retried).

        Status errors are raised on enter (410 -> OutputEvicted); transport errors while
        reading become APIConnectionError (APITimeout after 30 s without a byte).
        """
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError("after must be a non-negative integer")
        url = self._process_url(sandbox_id, process_id) + "/connect"
        return self._stream(
            url,
            operation="follow process output",
            accept="application/x-ndjson",
            params={"after": after},
            limits=STREAM_TIMEOUT,
        )

    @staticmethod
    def _process_url(sandbox_id: str, process_id: str) -> str:
        require_id(sandbox_id, "sandbox")
        require_id(process_id, "process")
        return f"/sandboxes/{sandbox_id}/processes/{process_id}"

    # ------------------------------------------------------------------ files

    async def put_file(
        self,
        sandbox_id: str,
        path: str,
        source: bytes | Path,
        *,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        """``PUT .../files?path=``: upload bytes, or stream a file from disk in chunks.

        The body is replayable, so the upload is retried like other idempotent calls.
        ``on_progress(n)`` reports the bytes sent so far in the current attempt.
        """
        operation = "upload file"
        require_id(sandbox_id, "sandbox")
        url = _file_url(sandbox_id, path)
        if isinstance(source, Path):
            size = (await anyio.Path(source).stat()).st_size
        else:
            size = len(source)
        await self._call(
            "PUT",
            url,
            operation=operation,
            retry_on=_IDEMPOTENT_RETRY,
            retry_transport=True,
            upload=lambda: UploadBody(source, size, on_progress),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            limits=FILE_TIMEOUT,
        )

    def get_file(
        self, sandbox_id: str, path: str
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """``GET .../files?path=`` as raw body chunks; errors are raised on enter.

        A GET is idempotent (createos-api.md 1.8), so opening the download is retried like
        other GETs; once body bytes flow, a cut is raised to the caller (no silent restart).
        """
        require_id(sandbox_id, "sandbox")
        return self._stream(
            _file_url(sandbox_id, path),
            operation="download file",
            accept="application/octet-stream, application/json",
            limits=FILE_TIMEOUT,
            retry_open=True,
        )


def _fits_deadline(delay: float) -> bool:
    """False when sleeping ``delay`` seconds would pass the caller's anyio deadline."""
    return anyio.current_time() + delay < anyio.current_effective_deadline()
