"""Pipe pumps: drain a command's pipes (or PTY master) as output arrives, and decide when a
command is finished (its leader's exit, then its output read to EOF or for a drain window).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from .guest import ChildWatch, ExitInfo

READ_SIZE = 1 << 20
F_SETPIPE_SZ = 1031
PIPE_SIZE = 1 << 20


@dataclass
class Pump:
    """State of one pipe being drained."""

    fd: int
    parked: bool = False
    eof: bool = False
    closed: anyio.Event = field(default_factory=anyio.Event)  # set with ``eof``

    def idle_and_empty(self) -> bool:
        if self.eof:
            return True
        if not self.parked:
            return False
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        return not poller.poll(0)


def prepare_read_fd(fd: int) -> None:
    os.set_blocking(fd, False)
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)


async def run_pump(pump: Pump, on_chunk: Callable[[memoryview], Awaitable[None]]) -> None:
    """Read ``pump.fd`` until EOF, handing every chunk to ``on_chunk``; closes the fd.

    Reads land in one reused buffer (no allocation per read); ``on_chunk`` gets a view that is
    only valid until it returns.
    """
    buffer = bytearray(READ_SIZE)
    view = memoryview(buffer)
    try:
        while True:
            try:
                size = os.readv(pump.fd, [buffer])
            except BlockingIOError:
                pump.parked = True
                try:
                    await anyio.wait_readable(pump.fd)
                finally:
                    pump.parked = False
                continue
            except OSError as exc:
                if exc.errno == errno.EIO:  # a PTY master once every slave fd is closed
                    break
                raise
            if not size:
                break
            await on_chunk(view[:size])
    finally:
        pump.eof = True
        pump.closed.set()
        os.close(pump.fd)


async def await_finish(watch: ChildWatch, pumps: list[Pump], drain_s: float | None) -> ExitInfo:
    """Wait for the leader's exit, then for its output to be fully read (see module doc);
    ``drain_s`` None: for every pipe's EOF, however long a background child keeps it open."""
    await watch.exited.wait()
    if drain_s is None:
        for pump in pumps:
            await pump.closed.wait()
        return watch.exit or ExitInfo(signal="SIGKILL")
    with anyio.move_on_after(drain_s):  # the usual end: every pipe's EOF, no polling
        for pump in pumps:
            await pump.closed.wait()
    delay = 0.001  # past the window, a background child holds a pipe: until both are quiet
    while not all(p.eof for p in pumps) and not all(p.idle_and_empty() for p in pumps):
        await anyio.sleep(delay)
        delay = min(delay * 2, 0.01)
    return watch.exit or ExitInfo(signal="SIGKILL")
