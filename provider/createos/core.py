"""The request core of the CreateOS client: transport, pacing, retries and error mapping.

The one place where httpx exceptions become :mod:`provider.createos.errors` (in
:meth:`ClientCore._attempts` and the streamed body it hands out, through
:func:`~provider.createos.errors.connection_error` and
:func:`~provider.createos.errors.response_error`); the
resource modules (:mod:`~provider.createos.sandboxes`, :mod:`~provider.createos.processes`,
:mod:`~provider.createos.files`) only build URLs and bodies and read the answers. Every request
attempt, retries and stream opens included, first waits for its turn at the origin's
:class:`~provider.createos.pacer.RequestPacer`; a 429 penalizes that pacer for every worker.
Redirects are never followed.

Retries (one attempt loop, :meth:`ClientCore._attempts`, one table, :func:`retry_policy`): GET,
DELETE, PUT of a replayable body and PATCH (we only PATCH absolute values) are retried on
transport errors and HTTP 408, 429, 500, 502, 503, 504; POST (sandbox creation, fork, process
creation and exec included) on 429 and 503, the two statuses by which the server says it did not
process the request (both official SDKs retry them on every method; a 503 is "no host with
capacity, retry shortly"). At most ``max_retries`` extra attempts, ``Retry-After`` (seconds or
an HTTP date) first, otherwise ``min(backoff_base * 2**n + U(0, backoff_base), 30)`` seconds. A
wait that would pass the caller's anyio deadline is not started: the error is raised at once
(for a ``Retry-After`` the message says so). A ``Retry-After`` of any length is waited for when
the deadline allows it; a call without a deadline waits at most
:data:`~provider.createos.retry.MAX_RETRY_AFTER`. A stream is retried only while opening and only
when asked (``retry_open``), never once its body has started.

A caller that must know whether a request could have had an effect passes a
:class:`~provider.createos.wire.Wire`, which the attempt loop keeps up to date.
"""

from __future__ import annotations

import importlib.metadata
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Final, Self

import anyio
import anyio.lowlevel
import httpcore
import httpx

from provider.createos.envelope import unwrap_success
from provider.createos.errors import (
    APIStatusError,
    CreateOSError,
    connection_error,
    response_error,
    retry_refused,
)
from provider.createos.pacer import RequestPacer, pacer_for
from provider.createos.retry import backoff_delay, wait_refused
from provider.createos.upload import UploadBody
from provider.createos.wire import Wire, settled

try:
    _VERSION = importlib.metadata.version("paperclip-plugin-createos")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
    _VERSION = "0"

USER_AGENT: Final = f"paperclip-plugin-createos/{_VERSION} python-httpx/{httpx.__version__}"
DEFAULT_TIMEOUT: Final = httpx.Timeout(connect=10.0, read=120.0, write=60.0, pool=10.0)
STREAM_READ_TIMEOUT: Final = 60.0
"""Streams: a read that waits this long for a byte (the Python SDK's per-read timeout) ends with
APITimeout. CreateOS documents heartbeats only on the exec stream, so on ``connect`` this is
not proof of a dead stream: its reader checks the process first (provider.createos.stream)."""


def stream_timeout(read: float = STREAM_READ_TIMEOUT) -> httpx.Timeout:
    """The timeouts of a stream that ends a read after ``read`` seconds without a byte."""
    return httpx.Timeout(connect=10.0, read=read, write=30.0, pool=10.0)


STREAM_TIMEOUT: Final = stream_timeout()
FILE_TIMEOUT: Final = httpx.Timeout(connect=10.0, read=60.0, write=60.0, pool=10.0)
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

IDEMPOTENT_RETRY: Final = frozenset({408, 429, 500, 502, 503, 504})
"""Statuses a GET, DELETE or replayable PUT is retried on."""
NOT_SENT: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport failures before any byte of the request left: nothing reached the server."""
POST_RETRY: Final = frozenset({429, 503})
"""Statuses a POST is retried on (the server says it did not process the request)."""
IDEMPOTENT_METHODS: Final = frozenset({"GET", "DELETE", "PUT", "PATCH"})
"""Retried like a GET (PATCH: we only PATCH absolute values; PUT: of a replayable body)."""


def retry_policy(method: str, *, retry: bool = True) -> tuple[frozenset[int], bool]:
    """What an attempt of ``method`` is retried on: the statuses, and whether transport errors
    too (module docstring). ``retry=False`` (a GET stream opened without ``retry_open``) turns
    an idempotent method's retries off; a POST keeps its 429 and 503 retries."""
    if method not in IDEMPOTENT_METHODS:
        return POST_RETRY, False
    if not retry:
        return frozenset(), False
    return IDEMPOTENT_RETRY, True


async def _sleep(seconds: float) -> None:
    """The wait between attempts (a seam for tests)."""
    await anyio.sleep(seconds)


class _Body:
    """A response body as an async iterator of bytes; transport errors become ours."""

    def __init__(self, response: httpx.Response, operation: str) -> None:
        self._chunks = response.aiter_bytes()
        self._operation = operation
        self.content_type = response.headers.get("content-type", "")  # a download checks it

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except httpx.RequestError as exc:
            raise connection_error(self._operation, exc) from exc

    async def aclose(self) -> None:
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()


def new_http_client(
    base_url: str, api_key: str, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """The keep-alive connection pool of one API and key (redirects are never followed).
    ``base_url`` is the origin, with a gateway's path prefix if any; requests go to
    ``<base_url>/v1/...``."""
    return httpx.AsyncClient(
        base_url=base_url.rstrip("/") + "/v1",
        headers={"X-Api-Key": api_key, "Accept": "application/json", "User-Agent": USER_AGENT},
        follow_redirects=False,
        timeout=DEFAULT_TIMEOUT,
        transport=transport,
    )


class ClientCore:
    """One API (origin, or origin and path prefix) and key: the connection pool, the pacer
    (keyed by the origin alone: the rate limit is per caller IP) and the request core.

    The resource mixins subclass it and call :meth:`_json_call`, :meth:`_call` and
    :meth:`_stream`; :class:`provider.createos.client.CreateOSClient` composes them.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        pacer: RequestPacer | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        http: httpx.AsyncClient | None = None,
        max_retries: int = 2,
        backoff_base: float = 0.5,
    ) -> None:
        """``http``: a connection pool shared with other clients of the same API and key
        (:func:`new_http_client`, kept by :class:`provider.createos.pool.ConnectionPool`); it
        is left open by :meth:`aclose`. Without it the client owns a pool of its own."""
        self.base_url = base_url.rstrip("/")
        self._pacer = pacer if pacer is not None else pacer_for(self.base_url)
        self._max_retries = max(0, max_retries)
        self._backoff_base = backoff_base
        self._owns_http = http is None
        self._http = (
            http if http is not None else new_http_client(self.base_url, api_key, transport)
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool, unless it is a shared one."""
        if self._owns_http:
            await self._http.aclose()

    async def _call(
        self,
        method: str,
        url: str,
        *,
        operation: str,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        upload: Callable[[], UploadBody] | None = None,
        headers: Mapping[str, str] | None = None,
        limits: httpx.Timeout = DEFAULT_TIMEOUT,
        wire: Wire | None = None,
    ) -> httpx.Response:
        """Send with pacing and retries (:func:`retry_policy` of ``method``); return the 2xx
        response or raise our error."""

        async def send() -> httpx.Response:
            body = upload() if upload is not None else None
            try:
                return await self._http.request(
                    method,
                    url,
                    params=params,
                    json=json,
                    content=body,
                    headers=headers,
                    timeout=limits,
                )
            finally:
                if body is not None:
                    body.close()

        return await self._attempts(send, operation, retry_policy(method), wire)

    async def _attempts(
        self,
        send: Callable[[], Awaitable[httpx.Response]],
        operation: str,
        policy: tuple[frozenset[int], bool],
        wire: Wire | None,
    ) -> httpx.Response:
        """The one attempt loop: each attempt waits for the pacer, then ``send``s. Return the
        2xx response; retry a status in the ``policy``'s set (and a transport error when it
        says so, :func:`retry_policy`) while :meth:`_retry_wait` allows; otherwise raise our
        error. A refused answer is closed before the next attempt. ``wire`` is kept up to date
        (module docstring)."""
        retry_on, retry_transport = policy
        wire = wire if wire is not None else Wire()
        attempt = 0
        while True:
            wire.queued = True
            await self._pacer.wait_turn()
            wire.queued, wire.sent = False, True
            cause: httpx.RequestError | None = None
            error: CreateOSError
            try:
                response = await settled(send, wire, operation)
            except httpx.RequestError as exc:
                cause, error = exc, connection_error(operation, exc)
                retryable = retry_transport
                wire.sent = not isinstance(exc, NOT_SENT)
            else:
                if 200 <= response.status_code < 300:
                    return response
                await response.aclose()
                error = response_error(response, operation)
                retryable = isinstance(error, APIStatusError) and error.status in retry_on
                wire.sent = not (isinstance(error, APIStatusError) and error.rejected)
            wire.queued = retryable  # a cancel in the retry wait leaves the request unsent
            final = await self._retry_wait(error, retryable, attempt)
            if final is None:
                attempt += 1
                continue
            if cause is not None:
                raise final from cause
            raise final

    async def _retry_wait(
        self, error: CreateOSError, retryable: bool, attempt: int
    ) -> CreateOSError | None:
        """After a failed attempt: a 429 holds every worker's pacer for its Retry-After. Then,
        when ``retryable`` and retries are left, wait (``Retry-After`` first, else backoff) and
        answer None; otherwise answer the error to raise. A wait the deadline does not allow
        is not started (:func:`~provider.createos.retry.wait_refused`); for a ``Retry-After``
        the error says so."""
        retry_after = error.retry_after if isinstance(error, APIStatusError) else None
        if isinstance(error, APIStatusError) and error.status == 429:
            await self._pacer.penalize(retry_after)
        if not retryable or attempt >= self._max_retries:
            return error
        await anyio.lowlevel.checkpoint_if_cancelled()  # a cancel wins over the error
        delay = backoff_delay(attempt, self._backoff_base, retry_after, jitter=random.uniform)
        why = wait_refused(delay)
        if why is None:
            await _sleep(delay)
            return None
        if retry_after is not None and isinstance(error, APIStatusError):
            return retry_refused(error, retry_after, why)
        return error

    async def _json_call(
        self,
        method: str,
        url: str,
        *,
        operation: str,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        wire: Wire | None = None,
    ) -> Any:
        """A JSend call: retried per the method (see the module docstring); returns ``data``."""
        response = await self._call(
            method, url, operation=operation, params=params, json=json, wire=wire
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
        json: Any = None,
        wire: Wire | None = None,
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """A streamed GET, or with ``json`` a streamed POST of that body. With ``retry_open``, a
        GET's opening (up to the response head) is retried like any idempotent request; a POST
        is retried only on 429 and 503, like any POST. A body cut once it has started is never
        retried here. ``wire`` says whether the request was sent (:mod:`provider.createos.wire`)."""
        method = "GET" if json is None else "POST"

        def send() -> Awaitable[httpx.Response]:
            request = self._http.build_request(
                method, url, params=params, json=json, headers={"Accept": accept}, timeout=limits
            )
            return self._http.send(request, stream=True)

        policy = retry_policy(method, retry=retry_open)
        response = await self._attempts(send, operation, policy, wire)
        try:
            body = _Body(response, operation)
            try:
                yield body
            finally:
                await body.aclose()
        finally:
            await response.aclose()
