"""Byte streams over the process's stdio and line framing.

``guard_stdout()`` (from :mod:`provider.rpc.handshake`) runs first thing: it keeps a private
duplicate of fd 1 for protocol lines and points fd 1 (and ``sys.stdout``) at stderr.

Pipes and sockets are read and written without blocking (``anyio.wait_readable`` /
``wait_writable``); anything else (a terminal, ``/dev/null``, a regular file) goes through a
worker thread. Incoming lines have no length cap.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections import deque
from typing import Final

import anyio
import anyio.abc

from provider.rpc.handshake import guard_stdout

__all__ = ["FdReceiveStream", "FdSendStream", "LineReader", "PrefixedReceiveStream", "guard_stdout"]

READ_CHUNK: Final = 256 * 1024
PIPE_SIZE: Final = 1024 * 1024


def _grow_pipe(fd: int) -> None:
    """Best effort: ask for a PIPE_SIZE buffer on a pipe (never shrinks it; errors ignored)."""
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    get_size = getattr(fcntl, "F_GETPIPE_SZ", None)
    if set_size is None or get_size is None or not stat.S_ISFIFO(os.fstat(fd).st_mode):
        return
    try:
        if fcntl.fcntl(fd, get_size) < PIPE_SIZE:
            fcntl.fcntl(fd, set_size, PIPE_SIZE)
    except OSError:  # EPERM above /proc/sys/fs/pipe-max-size, EBUSY: keep what there is
        pass


def _is_pollable(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class FdReceiveStream(anyio.abc.ByteReceiveStream):
    """Reads bytes from a file descriptor (stdin)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pollable = _is_pollable(fd)
        self._was_blocking = os.get_blocking(fd)
        if self._pollable:
            os.set_blocking(fd, False)
        self._closed = False

    async def receive(self, max_bytes: int = READ_CHUNK) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        while True:
            if self._pollable:
                try:
                    data = os.read(self._fd, max_bytes)
                except BlockingIOError:
                    await anyio.wait_readable(self._fd)
                    continue
            else:
                from anyio import to_thread  # lazily: only for terminals and files

                data = await to_thread.run_sync(
                    os.read, self._fd, max_bytes, abandon_on_cancel=True
                )
            if not data:
                raise anyio.EndOfStream
            return data

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            if self._pollable and self._was_blocking:
                os.set_blocking(self._fd, True)


class PrefixedReceiveStream(anyio.abc.ByteReceiveStream):
    """Yields ``prefix`` (bytes already read by the handshake) before reading ``inner``."""

    def __init__(self, prefix: bytes, inner: anyio.abc.ByteReceiveStream) -> None:
        self._prefix = prefix
        self._inner = inner

    async def receive(self, max_bytes: int = READ_CHUNK) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            return data
        return await self._inner.receive(max_bytes)

    async def aclose(self) -> None:
        await self._inner.aclose()


class FdSendStream(anyio.abc.ByteSendStream):
    """Writes bytes to a file descriptor (the private protocol fd); each item goes out whole.

    An item handed to :meth:`send` is owned by the stream from then on: it is written whole and
    in order even when that send is cancelled while it waits for the reader (the host) to make
    room. The unwritten rest of a cancelled send stays queued and goes out first, before the
    item of the next send, so a cancellation can delay a line but never cut one short (a cut
    line would glue itself to the next one and the host would drop both as unparseable). One
    sender at a time: the dispatcher's writer lock serializes the sends.

    A pipe is grown to :data:`PIPE_SIZE` when the system allows it, so a live-output line of a
    few hundred KiB goes out in one write instead of a wake-up per 64 KiB.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pollable = _is_pollable(fd)
        self._was_blocking = os.get_blocking(fd)
        if self._pollable:
            os.set_blocking(fd, False)
            _grow_pipe(fd)
        self._closed = False
        self._broken = False
        self._unwritten: deque[memoryview] = deque()  # items (or their rests) not yet written

    @property
    def unwritten(self) -> int:
        """Bytes handed to :meth:`send` and not written yet (the rest of a cancelled send)."""
        return sum(len(view) for view in self._unwritten)

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        if self._broken:
            raise anyio.BrokenResourceError
        if item:
            self._unwritten.append(memoryview(item))
        try:
            await self._write_unwritten()
        except OSError as exc:  # EPIPE and friends: the reader is gone
            self._broken = True
            self._unwritten.clear()
            raise anyio.BrokenResourceError from exc

    async def _write_unwritten(self) -> None:
        queue = self._unwritten
        while queue:
            view = queue[0]
            if self._pollable:
                try:
                    written = os.write(self._fd, view)
                except BlockingIOError:
                    await anyio.wait_writable(self._fd)  # a cancellation here keeps the rest
                    continue
            else:
                from anyio import to_thread  # lazily: only for terminals and files

                # Not abandoned on cancellation: the count of bytes written is always known.
                written = await to_thread.run_sync(os.write, self._fd, view)
            if written < len(view):
                queue[0] = view[written:]
            else:
                queue.popleft()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._unwritten.clear()
            if self._pollable and self._was_blocking:
                os.set_blocking(self._fd, True)


class LineReader:
    """Splits a byte stream into lines (LF or CRLF); no length cap; blank lines skipped."""

    def __init__(self, stream: anyio.abc.ByteReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer already known to hold no LF

    async def receive_line(self) -> bytes:
        """The next non-blank line without its terminator; ``anyio.EndOfStream`` at the end."""
        while True:
            line = self._next_buffered_line()
            if line is not None:
                if line.strip():
                    return line
                continue
            try:
                chunk = await self._stream.receive()
            except anyio.EndOfStream:
                rest = bytes(self._buffer).rstrip(b"\r")
                self._buffer.clear()
                self._scanned = 0
                if rest.strip():
                    return rest
                raise
            self._buffer += chunk

    def _next_buffered_line(self) -> bytes | None:
        index = self._buffer.find(b"\n", self._scanned)
        if index < 0:
            self._scanned = len(self._buffer)
            return None
        line = bytes(self._buffer[:index])
        del self._buffer[: index + 1]
        self._scanned = 0
        return line[:-1] if line.endswith(b"\r") else line
