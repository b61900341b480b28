"""The emulator's end of one sandbox's control channel, and the guest's life around it.

:class:`Guest` starts ``bwrap`` (``guest_process.py``), waits for the supervisor's ``ready``
event, then multiplexes requests, replies (with passed file descriptors) and events over one
SOCK_SEQPACKET socket. Exit events are recorded synchronously by the reader task, so a process
can never miss its own exit; a ``self`` event (from the guest agent) goes to ``on_self``."""

from __future__ import annotations

import contextlib
import json
import logging
import marshal
import os
import socket
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from . import guest_process
from .bwrap import GuestRuntime, sandbox_argv
from .hostscan import boot_ticks
from .usernet import UserNet

log = logging.getLogger("provider.emulator")

MAX_MSG = 1 << 20
# A request larger than this travels in a memfd passed with SCM_RIGHTS: one SOCK_SEQPACKET
# message is limited by the socket's send buffer (about 208 KiB by default, EMSGSIZE above it),
# and a spawn carries the whole argv (up to the 1 MiB request body).
INLINE_MSG = 64 * 1024
VIA_FD = "via_fd"  # the op of such a request's inline part (guest_channel.Channel.receive)
START_TIMEOUT_S = 20.0


class GuestGone(Exception):
    """The supervisor is gone (sandbox destroyed or crashed)."""


class GuestOpError(Exception):
    """The supervisor refused an operation; ``code`` is its machine word."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class ExitInfo:
    """How a spawned leader ended: ``code`` or ``signal`` (``SIG*`` name)."""

    code: int | None = None
    signal: str | None = None


@dataclass
class ChildWatch:
    """Exit and tree-exit notifications of one spawned command. ``tree`` is the id the
    supervisor gave it (its events name it; guest pids may be reused, tree ids never are)."""

    tree: int = 0
    exit: ExitInfo | None = None
    exited: anyio.Event = field(default_factory=anyio.Event)
    tree_gone: anyio.Event = field(default_factory=anyio.Event)


class Guest:
    """One running sandbox payload: bwrap + supervisor + control socket."""

    def __init__(self, runtime: GuestRuntime, on_self: Callable[[str, str], None]) -> None:
        self.runtime = runtime
        self.on_self = on_self  # (action, reason) of a guest agent request
        self.usernet: UserNet | None = None  # a user-mode sandbox's slirp4netns (kill stops it)
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.child_pidfd: int | None = None
        self.host_pid: int | None = None  # host pid of the supervisor (guest pid 1)
        self.pid_ns: str | None = None  # e.g. "pid:[4026532]" of the guest namespace
        self.ended_at: float | None = None  # boot ticks when the namespace was emptied
        self.children: dict[int, ChildWatch] = {}
        self._pending: dict[int, tuple[anyio.Event, list[Any]]] = {}
        self._next_id = 0
        self._send_lock = anyio.Lock()
        self._gone = False
        self._ready = anyio.Event()

    # -- lifecycle ----------------------------------------------------------------------
    async def start(
        self,
        tg: anyio.abc.TaskGroup,
        *,
        fs_dir: Path,
        etc_dir: Path,
        supervisor: Path,
        hostname: str,
        log_path: Path,
        unshare_net: bool,
        guest_agent: bool,
        image_mounts: Sequence[str] = (),
    ) -> None:
        """Launch bwrap and wait until the supervisor (and ``guest_agent``) is ready."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            argv = sandbox_argv(
                self.runtime,
                fs_dir=fs_dir,
                etc_dir=etc_dir,
                supervisor=supervisor,
                hostname=hostname,
                ctrl_fd=theirs.fileno(),
                unshare_net=unshare_net,
                guest_agent=guest_agent,
                image_mounts=image_mounts,
            )
            self.proc, info_r = guest_process.launch(argv, self.runtime, theirs.fileno(), log_path)
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        tg.start_soon(self._read_loop)
        try:
            with anyio.fail_after(START_TIMEOUT_S):
                info = await guest_process.read_info(info_r)
                await self._ready.wait()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.kill()
            raise
        finally:
            os.close(info_r)
        self.host_pid, self.child_pidfd, self.pid_ns = guest_process.supervisor_identity(info)
        if self._gone:
            raise GuestGone(
                f"sandbox payload exited during start{guest_process.log_tail(log_path)}"
            )

    async def kill(self) -> None:
        """SIGKILL the guest's pid 1 (the kernel then kills the whole namespace), wait until the
        namespace is empty, reap bwrap and stop its slirp4netns. Idempotent."""
        self._gone = True
        pidfd, self.child_pidfd = self.child_pidfd, None
        if pidfd is not None:
            await guest_process.stop_supervisor(pidfd)
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
        if self.proc is not None:
            await guest_process.reap_bwrap(self.proc)
        if self.pid_ns is not None and self.ended_at is None:
            await anyio.to_thread.run_sync(guest_process.empty_namespace, self.pid_ns)
            self.ended_at = boot_ticks()
        if self.usernet is not None:
            await self.usernet.stop()
        self._fail_pending()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    @property
    def alive(self) -> bool:
        return not self._gone

    # -- requests -----------------------------------------------------------------------
    async def request(self, op: str, **fields: Any) -> tuple[dict[str, Any], list[int]]:
        """Send one request and wait for its reply; returns (reply, passed fds)."""
        reply, fds, _watch = await self._call(op, fields)
        return reply, fds

    async def spawn(self, **fields: Any) -> tuple[int, list[int], ChildWatch]:
        """Start a command; returns (leader pid, passed fds, its watch). The watch exists from
        the reply on, so no event is missed (a quick command's may follow right after)."""
        reply, fds, watch = await self._call("spawn", fields)
        if watch is None:
            for fd in fds:
                os.close(fd)
            raise GuestGone("malformed spawn reply")
        return int(reply["pid"]), fds, watch

    async def _call(
        self, op: str, fields: dict[str, Any]
    ) -> tuple[dict[str, Any], list[int], ChildWatch | None]:
        if self._gone or self.sock is None:
            raise GuestGone("sandbox is gone")
        self._next_id += 1
        rid = self._next_id
        done = anyio.Event()
        slot: list[Any] = []
        self._pending[rid] = (done, slot)
        try:
            # marshal (version 2: readable by any python3 the guest may run) is cheap for the
            # supervisor to load; what comes back is JSON, never unmarshalled here.
            await self._send(marshal.dumps({"id": rid, "op": op, **fields}, 2))
            await done.wait()
        finally:
            self._pending.pop(rid, None)
        if not slot:
            raise GuestGone("sandbox is gone")
        reply, fds, watch = slot
        if not reply.get("ok"):
            for fd in fds:
                os.close(fd)
            raise GuestOpError(str(reply.get("error")), str(reply.get("message")))
        return reply, fds, watch

    async def _send(self, data: bytes) -> None:
        sock = self.sock
        assert sock is not None
        fds: list[int] = []
        if len(data) > INLINE_MSG:
            fds.append(os.memfd_create("createos-request", os.MFD_CLOEXEC))
            with open(fds[0], "wb", closefd=False) as body:  # noqa: ASYNC230 - memory, not disk
                body.write(data)
            data = marshal.dumps({"op": VIA_FD}, 2)
        try:
            async with self._send_lock:
                while True:
                    try:
                        if fds:
                            socket.send_fds(sock, [data], fds)
                        else:
                            sock.send(data)
                        return
                    except BlockingIOError:
                        await anyio.wait_writable(sock)
                    except OSError as exc:
                        raise GuestGone("sandbox is gone") from exc
        finally:
            for fd in fds:
                os.close(fd)

    async def _read_loop(self) -> None:
        sock = self.sock
        assert sock is not None
        try:
            while True:
                try:
                    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MSG, 8)
                except BlockingIOError:
                    await anyio.wait_readable(sock)
                    continue
                except OSError:
                    break
                if not data:
                    for fd in fds:
                        os.close(fd)
                    break
                try:
                    self._dispatch(json.loads(data), fds)
                except (ValueError, KeyError, TypeError, AttributeError):
                    # The supervisor runs inside the guest: never trust its messages.
                    log.warning("malformed message from a sandbox supervisor; dropping it")
                    for fd in fds:
                        with contextlib.suppress(OSError):
                            os.close(fd)
                    break
        finally:
            self._gone = True
            self._fail_pending()

    def _dispatch(self, msg: dict[str, Any], fds: list[int]) -> None:
        event = msg.get("event")
        if event is None:
            waiter = self._pending.get(int(msg.get("id", 0)))
            if waiter is None:
                for fd in fds:
                    os.close(fd)
                return
            watch = None
            if msg.get("ok") and "tree" in msg:
                watch = self.children[int(msg["tree"])] = ChildWatch(tree=int(msg["tree"]))
            waiter[1].extend([msg, fds, watch])
            waiter[0].set()
        elif event == "ready":
            self._ready.set()
        elif event == "exit":
            watch = self.children.get(int(msg["tree"]))
            if watch is not None:
                watch.exit = ExitInfo(code=msg.get("code"), signal=msg.get("signal"))
                watch.exited.set()
        elif event == "tree_exit":
            watch = self.children.pop(int(msg["tree"]), None)
            if watch is not None:
                watch.tree_gone.set()
        elif event == "self":
            self.on_self(str(msg["action"]), str(msg.get("reason", "")))
        for fd in fds if event is not None else ():
            os.close(fd)

    def _fail_pending(self) -> None:
        for done, _slot in list(self._pending.values()):
            done.set()
        self._ready.set()
        for watch in self.children.values():
            if watch.exit is None:
                watch.exit = ExitInfo(signal="SIGKILL")
            watch.exited.set()
            watch.tree_gone.set()
