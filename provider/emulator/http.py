"""A small HTTP/1.1 server on raw non-blocking sockets and anyio: h11 parses requests.

Responses are written by hand so bodies can be sent without copies: ``sendmsg`` gathers frame
buffers for NDJSON streams and ``os.sendfile`` serves file downloads. Content-Length request
bodies are read straight from the socket (large uploads never go through h11's buffer); chunked
ones go through h11. While a streaming response is idle, a watcher notices a client that hung
up, so a gone reader never holds a process journal back.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus

import anyio
import h11

from .http_messages import ClientGone, Handler, Request, Response, StreamCut
from .http_socket import RECV_SIZE, Connection

log = logging.getLogger("provider.emulator")


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
