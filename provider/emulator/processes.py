"""Managed processes and one-shot exec: output, exit detection, stdin, tree kill.

The supervisor spawns each command in a new session and passes the parent ends of its pipes to
the emulator, which reads them directly (no relay hop). A pump (``pumps.py``) keeps draining a
pipe into the journal whether or not a reader is attached. "Finished" means the leader's exit is
known and both pipes reached EOF, or stayed empty for ``exit_drain_ms`` (a background child may
keep them open); only then is the ``exit`` line appended, after every data frame read so far.
A streamed exec finishes at EOF only (docs/protocol.md C5: the worst case of an unknown).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import termios
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from .guest import ChildWatch, ExitInfo, Guest, GuestGone
from .hostscan import guest_command
from .ids import new_id, utc_now
from .journal import Journal
from .pumps import Pump, await_finish, prepare_read_fd, run_pump
from .settings import Settings

SIGNALS = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGKILL", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGWINCH")
MAX_INPUT = 256 * 1024
MAX_QUEUED_INPUT = 8 << 20


def exit_line(info: ExitInfo) -> bytes:
    if info.signal is not None:
        return b'{"type":"exit","signal":"%s"}\n' % info.signal.encode()
    return b'{"type":"exit","exit_code":%d}\n' % (info.code if info.code is not None else -1)


class StdinWriter:
    """Queued, non-blocking writes to a process's stdin pipe.

    ``closed``: no more input is taken (closed by the client, or the process's tree is gone);
    ``closed_by_client``: a ``stdin/close`` was answered, so another one is a conflict.
    """

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.closed = fd is None
        self.closed_by_client = False
        self.queued = 0
        self._queue: list[bytes] = []
        self._wake = anyio.Event()
        if fd is not None:
            os.set_blocking(fd, False)

    def push(self, data: bytes) -> None:
        self._queue.append(data)
        self.queued += len(data)
        self._wake.set()

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    async def run(self) -> None:
        fd = self.fd
        if fd is None:
            return
        try:
            while True:
                while self._queue:
                    data = memoryview(self._queue[0])
                    while data:
                        try:
                            n = os.write(fd, data)
                        except BlockingIOError:
                            await anyio.wait_writable(fd)
                            continue
                        except OSError:  # reader gone (EPIPE): drop the rest
                            self._queue.clear()
                            self.queued = 0
                            return
                        data = data[n:]
                        self.queued -= n
                    self._queue.pop(0)
                if self.closed:
                    return
                self._wake = anyio.Event()
                await self._wake.wait()
        finally:
            self.fd = None
            os.close(fd)


@dataclass
class ManagedProcess:
    """One process of ``/processes``: journal, state flags and its stdin."""

    sandbox_id: str
    pid: int
    cmd: str
    args: list[str]
    cwd: str
    journal: Journal
    stdin: StdinWriter
    watch: ChildWatch
    process_id: str = field(default_factory=lambda: new_id("proc_"))
    created_at: str = field(default_factory=utc_now)
    state: str = "running"
    error: str | None = None
    exit: ExitInfo | None = None
    finished_at: str | None = None
    input_seq: int = 0
    finished: anyio.Event = field(default_factory=anyio.Event)
    kind: str = "process"
    pty_fd: int | None = None  # PTY master kept for resize and the foreground group
    on_output: Callable[[], None] | None = None  # each journalled chunk (the idle clock)

    @property
    def leader_exited(self) -> bool:
        return self.exit is not None

    @property
    def tree_exited(self) -> bool:
        return self.exit is not None and self.watch.tree_gone.is_set()

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "process_id": self.process_id,
            "kind": self.kind,
            "pid": self.pid,
            "state": self.state,
            "leader_exited": self.leader_exited,
            "tree_exited": self.tree_exited,
            "created_at": self.created_at,
            "cmd": self.cmd,
            "args": self.args,
            "cwd": self.cwd,
            "output": self.journal.describe(),
        }
        if self.exit is not None:
            if self.exit.signal is not None:
                out["signal"] = self.exit.signal
            else:
                out["exit_code"] = self.exit.code
            out["finished_at"] = self.finished_at
        if self.error is not None:
            out["error"] = self.error
        foreground = self.foreground()
        if foreground is not None:
            out["foreground"] = foreground
        return out

    def foreground_group(self) -> int | None:
        """Host pid of the PTY's foreground process group, if any."""
        if self.pty_fd is None:
            return None
        try:
            group = os.tcgetpgrp(self.pty_fd)
        except OSError:
            return None
        return group if group > 0 else None

    def foreground(self) -> dict[str, Any] | None:
        """The PTY's foreground job as ``{pid, cmd, args}`` (its group leader, guest pid)."""
        group = self.foreground_group()
        return None if group is None else guest_command(group)

    def resize(self, rows: int, cols: int) -> None:
        assert self.pty_fd is not None
        fcntl.ioctl(self.pty_fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    async def run(self, fds: list[int], settings: Settings) -> None:
        """Pump the output (both pipes, or the PTY), feed stdin, record the exit, until the
        tree is gone."""
        if self.kind == "pty":
            pumps = [Pump(fds[1])]
            names = ["pty"]
        else:
            pumps = [Pump(fds[1]), Pump(fds[2])]
            names = ["stdout", "stderr"]
        for pump in pumps:
            prepare_read_fd(pump.fd)
        try:
            await self._run(pumps, names, settings)
        finally:
            if self.pty_fd is not None:
                os.close(self.pty_fd)
                self.pty_fd = None
            if not self.finished.is_set():  # sandbox destroyed: readers and waiters end too
                self._record_exit(self.watch.exit or ExitInfo(signal="SIGKILL"))

    async def _run(self, pumps: list[Pump], names: list[str], settings: Settings) -> None:
        async with anyio.create_task_group() as tg:
            for pump, name in zip(pumps, names, strict=True):
                tg.start_soon(run_pump, pump, self._journal_to(name))
            tg.start_soon(self.stdin.run)
            info = await await_finish(self.watch, pumps, settings.exit_drain_ms / 1000)
            self._record_exit(info)
            await self.watch.tree_gone.wait()
            self.stdin.close()

    def _record_exit(self, info: ExitInfo) -> None:
        self.exit = info
        self.finished_at = utc_now()
        if self.state != "failed":
            self.state = "exited"
        self.journal.finish(exit_line(info))
        self.finished.set()

    def _journal_to(self, stream: str) -> Callable[[memoryview], Awaitable[None]]:
        async def on_chunk(data: memoryview) -> None:
            if self.on_output is not None:
                self.on_output()
            await self.journal.append(stream, data)

        return on_chunk

    async def kill_tree(self, guest: Guest, grace_ms: int) -> None:
        """SIGTERM every descendant (whatever its session or group), freeze and SIGKILL them
        after ``grace_ms``, return once nothing of the tree is left."""
        if not self.tree_exited and self.state != "exited":
            self.state = "terminating"
        if not self.tree_exited:
            with contextlib.suppress(GuestGone):
                await guest.request("kill_tree", tree=self.watch.tree, grace_ms=grace_ms)
            await self.watch.tree_gone.wait()
        await self.finished.wait()


@dataclass
class ExecResult:
    stdout: bytes
    stderr: bytes
    exit: ExitInfo


async def run_exec(
    guest: Guest,
    fds: list[int],
    watch: ChildWatch,
    stdin: bytes,
    settings: Settings,
    on_output: Callable[[str, bytes], Awaitable[None]],
    *,
    until_eof: bool = False,
) -> ExitInfo:
    """Drive one spawned exec: write stdin then close it, stream output, wait for the exit.

    ``until_eof``: finish only when both pipes reach EOF (a background child holding stdout
    keeps the exec going), else ``exit_drain_ms`` after the leader's exit, as processes do.
    """
    writer = StdinWriter(fds[0])
    if stdin:
        writer.push(stdin)
    writer.close()
    pumps = [Pump(fds[1]), Pump(fds[2])]
    for pump in pumps:
        prepare_read_fd(pump.fd)

    def sink(stream: str) -> Callable[[memoryview], Awaitable[None]]:
        async def on_chunk(data: memoryview) -> None:
            await on_output(stream, bytes(data))

        return on_chunk

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        tg.start_soon(run_pump, pumps[0], sink("stdout"))
        tg.start_soon(run_pump, pumps[1], sink("stderr"))
        drain = None if until_eof else settings.exit_drain_ms / 1000
        info = await await_finish(watch, pumps, drain)
        tg.cancel_scope.cancel()
    return info
