"""What the emulator's HTTP server hands a handler and takes back: requests and responses.

A :class:`Request` reads its own body (Content-Length bodies straight from the socket, chunked
ones through h11), once, as chunks or whole; a :class:`Response` carries exactly one of a body,
an NDJSON stream of buffer lists, or a file to ``sendfile``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

import h11

from .http_socket import RECV_SIZE, Connection

DRAIN_LIMIT = 8 << 20


class ClientGone(Exception):
    """The client closed the connection before its request body was complete."""


class StreamCut(Exception):
    """Raised by a streaming body to close the connection abruptly (no final chunk)."""


@dataclass
class FileBody:
    """An open file to send with ``sendfile``; the server closes ``fd`` afterwards."""

    fd: int
    size: int


@dataclass
class Response:
    """What a handler answers. Exactly one of ``body``, ``stream`` or ``file`` is used."""

    status: int
    body: bytes = b""
    content_type: str | None = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)
    stream: AsyncIterator[list[bytes]] | None = None
    file: FileBody | None = None
    cut_after_bytes: int | None = None  # close abruptly after this many body bytes
    drop: bool = False  # close the connection without answering


class Request:
    """One parsed request; the body can be consumed once, as chunks or whole."""

    def __init__(
        self,
        conn: Connection,
        event: h11.Request,
        parser: h11.Connection,
        client: str,
    ) -> None:
        target = event.target.decode("latin-1")
        path, _, query = target.partition("?")
        self.method = event.method.decode("ascii").upper()
        self.path = path
        self.query = query
        self.params = dict(parse_qsl(query, keep_blank_values=True))
        self.headers: dict[str, str] = {}
        for name, value in event.headers:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text
        self.client = client
        self.keep_alive = (
            event.http_version == b"1.1"
            and "close" not in self.headers.get("connection", "").lower()
        )
        self._conn = conn
        self._parser = parser
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        length = self.headers.get("content-length")
        self.content_length: int | None = None if self._chunked or length is None else int(length)
        self._consumed = not self._chunked and not self.content_length
        self._started = False
        self.leftover = b"" if not self._consumed else parser.trailing_data[0]

    @property
    def body_consumed(self) -> bool:
        return self._consumed

    async def body_chunks(self) -> AsyncIterator[bytes]:
        """Yield the request body as it arrives (raises ClientGone on a cut upload)."""
        if self._started:
            raise RuntimeError("request body already consumed")
        self._started = True
        if self._consumed:
            return
        if self.headers.get("expect", "").lower() == "100-continue":
            await self._conn.send_buffers([b"HTTP/1.1 100 Continue\r\n\r\n"])
        if self._chunked:
            async for chunk in self._chunked_body():
                yield chunk
            return
        remaining = self.content_length or 0
        pre = self._parser.trailing_data[0]
        if pre:
            first, self.leftover = pre[:remaining], pre[remaining:]
            remaining -= len(first)
            if first:
                yield first
        while remaining > 0:
            data = await self._conn.recv(min(remaining, RECV_SIZE))
            if not data:
                raise ClientGone("client closed the connection mid-body")
            remaining -= len(data)
            yield data
        self._consumed = True

    async def _chunked_body(self) -> AsyncIterator[bytes]:
        parser = self._parser
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as exc:
                raise ClientGone("malformed chunked body") from exc
            if event is h11.NEED_DATA:
                data = await self._conn.recv(RECV_SIZE)
                if not data:
                    raise ClientGone("client closed the connection mid-body")
                parser.receive_data(data)
            elif isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._consumed = True
                self.leftover = parser.trailing_data[0]
                return

    async def read_body(self, limit: int) -> bytes | None:
        """The whole body, or None when it exceeds ``limit`` bytes."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.body_chunks():
            size += len(chunk)
            if size > limit:
                return None
            parts.append(chunk)
        return b"".join(parts)

    async def drain(self) -> bool:
        """Discard an unread body (up to DRAIN_LIMIT); True when the connection can be reused."""
        if self._consumed:
            return True
        if self._started or (self.content_length or 0) > DRAIN_LIMIT:
            return False
        try:
            async for _ in self.body_chunks():
                pass
        except ClientGone:
            return False
        return self._consumed


Handler = Callable[[Request], Awaitable[Response]]
