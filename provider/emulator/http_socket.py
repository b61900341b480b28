"""Non-blocking socket I/O on the event loop, for the emulator's HTTP server.

``sendmsg`` gathers many buffers into one call (large batches off the loop thread) and
``os.sendfile`` serves files without copying them through Python.
"""

from __future__ import annotations

import contextlib
import os
import socket

import anyio

RECV_SIZE = 256 * 1024
MAX_IOV = 512
THREAD_SEND_BYTES = 512 * 1024


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
