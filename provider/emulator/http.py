"""A small HTTP/1.1 server on raw non-blocking sockets and anyio: h11 parses requests.

Responses are written by hand so bodies can be sent without copies: ``sendmsg`` gathers frame
buffers for NDJSON streams and ``os.sendfile`` serves file downloads. Content-Length request
bodies are read straight from the socket (large uploads never go through h11's buffer); chunked
ones go through h11. While a streaming response is idle, a watcher notices a client that hung
up, so a gone reader never holds a process journal back.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qsl

import anyio
import h11

log = logging.getLogger("provider.emulator")

RECV_SIZE = 256 * 1024
MAX_IOV = 512
DRAIN_LIMIT = 8 << 20
THREAD_SEND_BYTES = 512 * 1024


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


class Connection:
    """Non-blocking socket I/O on the event loop."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def recv(self, size: int) -> bytes:
        while True:
            try:
                return self.sock.recv(size)
            except BlockingIOError:
                await anyio.wait_readable(self.sock)
            except (ConnectionResetError, BrokenPipeError):
                return b""

    async def send_buffers(self, buffers: list[bytes]) -> None:
        views = [memoryview(b) for b in buffers if b]
        while views:
            batch = views[:MAX_IOV]
            try:
                if sum(len(v) for v in batch) >= THREAD_SEND_BYTES:
                    # Large copies into the socket run off the loop thread (the GIL is
                    # released), overlapping with base64 encoding of the next frames.
                    sent = await anyio.to_thread.run_sync(self.sock.sendmsg, batch)
                else:
                    sent = self.sock.sendmsg(batch)
            except BlockingIOError:
                await anyio.wait_writable(self.sock)
                continue
            while sent:
                if sent >= len(views[0]):
                    sent -= len(views[0])
                    views.pop(0)
                else:
                    views[0] = views[0][sent:]
                    sent = 0

    async def sendfile(self, fd: int, count: int) -> None:
        offset = 0
        while offset < count:
            try:
                sent = await anyio.to_thread.run_sync(
                    os.sendfile, self.sock.fileno(), fd, offset, count - offset
                )
            except BlockingIOError:
                await anyio.wait_writable(self.sock)
                continue
            if sent == 0:
                raise ConnectionError("file shrank while sending")
            offset += sent

    async def watch_hangup(self, scope: anyio.CancelScope) -> None:
        """Cancel ``scope`` when the peer closes while we stream to it."""
        try:
            await anyio.wait_readable(self.sock)
            data = self.sock.recv(1, socket.MSG_PEEK)
        except OSError:
            data = b""
        if not data:
            scope.cancel()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


Handler = Callable[[Request], Awaitable[Response]]


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class HTTPServer:
    """Accept loop plus one task per connection, each serving requests in sequence."""

    def __init__(self, handler: Handler, on_error: Callable[[Request], Response]) -> None:
        self.handler = handler
        self.on_error = on_error
        self.sock: socket.socket | None = None

    def bind(self, host: str, port: int) -> tuple[str, int]:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.setblocking(False)
        self.sock = sock
        bound = sock.getsockname()
        return str(bound[0]), int(bound[1])

    async def serve(self) -> None:
        sock = self.sock
        assert sock is not None
        try:
            async with anyio.create_task_group() as tg:
                while True:
                    try:
                        client, addr = sock.accept()
                    except BlockingIOError:
                        await anyio.wait_readable(sock)
                        continue
                    except OSError as exc:
                        if exc.errno in (errno.EMFILE, errno.ENFILE):
                            await anyio.sleep(0.05)
                            continue
                        raise
                    tg.start_soon(self._serve_connection, client, str(addr[0]))
        finally:
            sock.close()

    async def _serve_connection(self, client: socket.socket, host: str) -> None:
        conn = Connection(client)
        leftover = b""
        try:
            while True:
                parser = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
                if leftover:
                    parser.receive_data(leftover)
                event = await self._next_request(conn, parser)
                if event is None:
                    return
                request = Request(conn, event, parser, host)
                try:
                    response = await self.handler(request)
                except ClientGone:
                    return
                except Exception:
                    log.exception("unhandled error in %s %s", request.method, request.path)
                    response = self.on_error(request)
                if response.drop:
                    return
                keep = request.keep_alive and response.cut_after_bytes is None
                if not request.body_consumed:
                    keep = keep and await request.drain()
                if not await self._respond(conn, response, keep):
                    return
                if not keep:
                    return
                leftover = request.leftover
        except (ConnectionError, OSError) as exc:
            log.debug("connection closed: %s", exc)
        finally:
            conn.close()

    async def _next_request(self, conn: Connection, parser: h11.Connection) -> h11.Request | None:
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError:
                await conn.send_buffers(
                    [_head(400, [("Content-Length", "0"), ("Connection", "close")])]
                )
                return None
            if event is h11.NEED_DATA:
                parser.receive_data(await conn.recv(RECV_SIZE))
                continue
            if isinstance(event, h11.Request):
                return event
            return None

    async def _respond(self, conn: Connection, response: Response, keep: bool) -> bool:
        """Write one response; False when the connection must close (a cut, a hang-up)."""
        headers = list(response.headers)
        if response.content_type is not None:
            headers.append(("Content-Type", response.content_type))
        if not keep:
            headers.append(("Connection", "close"))
        if response.stream is not None:
            headers.append(("Transfer-Encoding", "chunked"))
            await conn.send_buffers([_head(response.status, headers)])
            return await self._send_stream(conn, response.stream, response.cut_after_bytes)
        if response.file is not None:
            try:
                headers.append(("Content-Length", str(response.file.size)))
                await conn.send_buffers([_head(response.status, headers)])
                count = response.file.size
                if response.cut_after_bytes is not None:
                    count = min(count, response.cut_after_bytes)
                await conn.sendfile(response.file.fd, count)
                return count == response.file.size
            finally:
                os.close(response.file.fd)
        body = response.body
        if response.status in (204, 304) or 100 <= response.status < 200:
            body = b""
        else:
            headers.append(("Content-Length", str(len(body))))
        if response.cut_after_bytes is not None and response.cut_after_bytes < len(body):
            await conn.send_buffers(
                [_head(response.status, headers), body[: response.cut_after_bytes]]
            )
            return False
        await conn.send_buffers([_head(response.status, headers), body])
        return True

    async def _send_stream(
        self, conn: Connection, stream: AsyncIterator[list[bytes]], cut: int | None
    ) -> bool:
        budget = cut
        complete = False
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(conn.watch_hangup, tg.cancel_scope)
                async for buffers in _until_cut(stream):
                    if buffers is None:
                        break
                    if budget is not None:
                        buffers = _truncate(buffers, budget)
                        budget -= sum(len(b) for b in buffers)
                    size = sum(len(b) for b in buffers)
                    if size:
                        await conn.send_buffers([b"%x\r\n" % size, *buffers, b"\r\n"])
                    if budget is not None and budget <= 0:
                        break
                else:
                    await conn.send_buffers([b"0\r\n\r\n"])
                    complete = True
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # A client that hung up mid-stream surfaces as an OSError inside the task group;
            # that ends this connection only, never the server.
            _gone, rest = group.split((ConnectionError, OSError))
            if rest is not None:
                raise
            return False
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
        return complete


async def _until_cut(stream: AsyncIterator[list[bytes]]) -> AsyncIterator[list[bytes] | None]:
    """Pass ``stream`` through; a ``StreamCut`` becomes a final None (close abruptly)."""
    try:
        async for buffers in stream:
            yield buffers
    except StreamCut:
        yield None


def _truncate(buffers: list[bytes], budget: int) -> list[bytes]:
    out: list[bytes] = []
    for buf in buffers:
        if budget <= 0:
            break
        if len(buf) > budget:
            out.append(buf[:budget])
            break
        out.append(buf)
        budget -= len(buf)
    return out
