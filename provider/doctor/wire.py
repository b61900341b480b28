"""The doctor's view of the wire: every response's status and ``Retry-After``, and streams read
line by line with the time each line arrived.

The one place the doctor uses httpx itself. The worker's client
(:class:`~provider.createos.client.CreateOSClient`) runs on the same connection pool, so its
requests are recorded too: a 429 the client retried still shows in :attr:`Wire.seen`. The record
holds the method, path, status and ``Retry-After`` only: never a header with the key, never a
body. httpx errors of the streams opened here become :mod:`provider.createos.errors`, as in the
client's core.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal

import anyio
import httpx

from provider.createos.client import CreateOSClient, new_http_client
from provider.createos.errors import APIConnectionError, APITimeout, status_error
from provider.createos.pacer import pacer_for
from provider.doctor.report import HEARTBEAT_LIMIT_S

STREAM_READ_S: Final = HEARTBEAT_LIMIT_S + 10.0
"""The default longest silence of a stream before its read times out."""

Framing = Literal["ndjson", "sse", "comment", "other"]


@dataclass(frozen=True)
class Seen:
    """One HTTP response as the doctor saw it."""

    method: str
    path: str
    status: int
    retry_after: str | None


@dataclass(frozen=True)
class Line:
    """One non-blank stream line: when it came (seconds since the stream opened), its JSON
    object (None for a comment or anything that is not a JSON object) and its framing."""

    at: float
    frame: dict[str, Any] | None
    framing: Framing


class RecordingTransport(httpx.AsyncBaseTransport):
    """Passes requests on and records each response's status and ``Retry-After``."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner
        self.seen: list[Seen] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        retry_after = response.headers.get("retry-after")
        self.seen.append(Seen(request.method, request.url.path, response.status_code, retry_after))
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def parse_line(raw: bytes, at: float) -> Line | None:
    """A stream line as :class:`Line`; None when blank. SSE framing (``data:`` prefixes,
    ``:`` comments, ``event:``/``id:``/``retry:`` fields) is recognised and reported."""
    text = raw.decode("utf-8", "replace").strip()
    if not text:
        return None
    if text.startswith(":") or text.split(":", 1)[0] in ("event", "id", "retry"):
        return Line(at, None, "comment")
    framing: Framing = "ndjson"
    if text.startswith("data:"):
        text, framing = text[5:].strip(), "sse"
    try:
        frame = json.loads(text)
    except ValueError:
        return Line(at, None, "other")
    return Line(at, frame, framing) if isinstance(frame, dict) else Line(at, None, "other")


class Wire:
    """One origin and key: the recorded connection pool, the client on it, raw streams."""

    def __init__(self, origin: str, api_key: str) -> None:
        self.origin = origin
        self._recorder = RecordingTransport(httpx.AsyncHTTPTransport())
        self._http = new_http_client(origin, api_key, self._recorder)
        self.client = CreateOSClient(origin, api_key, http=self._http)

    @property
    def seen(self) -> list[Seen]:
        return self._recorder.seen

    async def aclose(self) -> None:
        await self.client.aclose()
        await self._http.aclose()

    @asynccontextmanager
    async def lines(
        self,
        method: str,
        path: str,
        *,
        operation: str,
        json_body: Any = None,
        params: Mapping[str, str | int] | None = None,
        read_s: float = STREAM_READ_S,
    ) -> AsyncIterator[AsyncIterator[Line]]:
        """A streamed request (paced like the client's, never retried), read as timed lines.
        A non-2xx answer raises the client's status error; a silence of ``read_s`` seconds
        raises :class:`~provider.createos.errors.APITimeout`."""
        await pacer_for(self.origin).wait_turn()
        timeout = httpx.Timeout(connect=10.0, read=read_s, write=30.0, pool=10.0)
        request = self._http.build_request(
            method,
            path,
            json=json_body,
            params=params,
            headers={"Accept": "application/x-ndjson"},
            timeout=timeout,
        )
        try:
            response = await self._http.send(request, stream=True)
        except httpx.RequestError as exc:
            raise _transport_error(operation, exc) from exc
        try:
            if not 200 <= response.status_code < 300:
                raise status_error(operation, response.status_code)
            yield _timed_lines(response, operation, anyio.current_time())
        finally:
            await response.aclose()


async def _timed_lines(
    response: httpx.Response, operation: str, opened: float
) -> AsyncIterator[Line]:
    pending = b""
    try:
        async for chunk in response.aiter_bytes():
            at = anyio.current_time() - opened
            *complete, pending = (pending + chunk).split(b"\n")
            for raw in complete:
                line = parse_line(raw, at)
                if line is not None:
                    yield line
    except httpx.RequestError as exc:
        raise _transport_error(operation, exc) from exc
    last = parse_line(pending, anyio.current_time() - opened)
    if last is not None:
        yield last


def never_sent(exc: BaseException) -> bool:
    """True when ``exc`` (an error of the client or of :class:`Wire`) failed while connecting:
    the request never reached the server, so even a create made nothing."""
    return isinstance(exc.__cause__, httpx.ConnectError | httpx.ConnectTimeout)


def _transport_error(operation: str, exc: httpx.RequestError) -> APIConnectionError:
    kind = type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return APITimeout(operation, f"CreateOS {operation} failed: timed out ({kind}).")
    return APIConnectionError(operation, f"CreateOS {operation} failed: connection error ({kind}).")
