"""The live side of a sandbox: booting its bwrap guest and starting commands in it.

:class:`GuestHost` is the base of :class:`~.sandboxes.Sandbox` that owns the guest (one
``bwrap`` whose payload, the supervisor, is pid 1 of a new PID namespace: ``guest.py``,
``bwrap.py``), the task group it and every managed process run in (alive until the sandbox is
closed), and the bookkeeping of those processes (``processes``, keyed by process id). Spawns
for exec go through :meth:`GuestHost.spawn`, supervisor requests (files, signals, freeze)
through :meth:`GuestHost.request`. The status machine on top lives in ``sandboxes.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from .bwrap import GUEST_PATH, GuestRuntime
from .guest import ChildWatch, Guest, GuestGone
from .images import image_mounts
from .journal import Journal
from .processes import ManagedProcess, StdinWriter
from .sandbox_fs import SandboxFiles
from .sandbox_spec import SandboxSpec
from .settings import Settings
from .usernet import HOST, USER_MODE, UserNet, write_resolv_conf

log = logging.getLogger("provider.emulator")


class GuestHost:
    """A sandbox's guest, its task group and its managed processes."""

    def __init__(
        self,
        sandbox_id: str,
        spec: SandboxSpec,
        *,
        files: SandboxFiles,
        runtime: GuestRuntime,
        settings: Settings,
        network: str,
        on_activity: Callable[[], None],
    ) -> None:
        self.id = sandbox_id
        self.spec = spec
        self.files = files
        self.runtime = runtime
        self.settings = settings
        # usernet.USER_MODE, LOOPBACK_ONLY or HOST: decided at create or fork, never changed.
        self.network = network
        # Set by the core: what a guest agent request (action, reason) does.
        self.on_self: Callable[[str, str], None] | None = None
        self.spawn_ms = 0
        self.guest: Guest | None = None
        self.processes: dict[str, ManagedProcess] = {}
        self._on_activity = on_activity  # a managed process journaled output
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = anyio.Event()

    @property
    def closed(self) -> bool:
        """Killed (deleted, reset or shut down): it must not boot again."""
        return self._closed.is_set()

    # -- boot and teardown --------------------------------------------------------------
    def _image_mounts(self) -> list[str]:
        """bwrap overlay of the sandbox's image, read at every boot (the folder may change)."""
        root = self.spec.image_root
        return [] if root is None else image_mounts(root, self.spec.rootfs)

    async def _boot(self, tg: anyio.abc.TaskGroup, supervisor: Path, mounts: list[str]) -> None:
        # Held while booting: a delete meanwhile removes the state dir only once the guest has
        # started (and is then killed) or failed, never while its files are being written.
        self.files.hold()
        try:
            self._check_open()
            await anyio.to_thread.run_sync(self.files.prepare)
            if self.network == USER_MODE:
                await anyio.to_thread.run_sync(write_resolv_conf, self.files.etc_dir)
            self._check_open()
            guest = Guest(self.runtime, self._self_request)
            self.guest = guest
            await guest.start(
                tg,
                fs_dir=self.files.fs_dir,
                etc_dir=self.files.etc_dir,
                supervisor=supervisor,
                hostname=self.spec.name,
                log_path=self.files.state_dir / "supervisor.log",
                unshare_net=self.network != HOST,
                guest_agent=self.settings.guest_agent and self.network != HOST,
                image_mounts=mounts,
            )
            if self.network == USER_MODE:  # a failure ends the boot: the guest is then killed
                guest.usernet = await UserNet.attach(guest.host_pid, self.files.state_dir)
        finally:
            self.files.release()

    def _self_request(self, action: str, reason: str) -> None:
        if self.on_self is not None:
            self.on_self(action, reason)

    def _check_open(self) -> None:
        if self.closed:
            raise GuestGone("the sandbox was deleted while it booted")

    def start_soon(self, func: Callable[[], Awaitable[Any]]) -> None:
        """Run ``func`` in the sandbox's task group; its errors are logged, never propagated."""
        if self._tg is not None and not self._closed.is_set():
            self._tg.start_soon(guarded, func)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def freeze(self, stop: bool) -> None:
        if self.guest is not None:
            with contextlib.suppress(GuestGone):
                await self.guest.request("freeze", stop=stop)

    async def kill_guest(self) -> None:
        """Kill every process of the sandbox now (idempotent)."""
        with anyio.CancelScope(shield=True):
            if self.guest is not None:
                await self.guest.kill()
                self.guest.close()
            self._closed.set()

    # -- guest operations ---------------------------------------------------------------
    def base_env(self, overrides: dict[str, str]) -> dict[str, str]:
        env = {"PATH": GUEST_PATH, "HOME": "/root", "LANG": "C.UTF-8", "USER": "root"}
        env["HOSTNAME"] = self.spec.name
        env.update(self.spec.envs)
        env.update(overrides)
        return env

    async def spawn(
        self,
        cmd: str,
        args: list[str],
        env: dict[str, str],
        cwd: str,
        pty: dict[str, int] | None = None,
    ) -> tuple[int, list[int], ChildWatch]:
        guest = self._require_guest()
        fields: dict[str, Any] = {"cmd": cmd, "args": args, "env": self.base_env(env), "cwd": cwd}
        if pty is not None:
            fields["pty"] = pty
        return await guest.spawn(**fields)

    async def start_process(
        self,
        cmd: str,
        args: list[str],
        env: dict[str, str],
        cwd: str,
        pty: dict[str, int] | None = None,
    ) -> ManagedProcess:
        if self._tg is None or self._closed.is_set():
            raise GuestGone("sandbox is gone")
        if pty is not None:
            env = {"TERM": "xterm-256color", **env}
        pid, fds, watch = await self.spawn(cmd, args, env, cwd, pty)
        if pty is not None:
            # One master, three roles: reader (pump), writer (input), control (ioctls).
            fds = [os.dup(fds[0]), fds[0], os.dup(fds[0])]
        process = ManagedProcess(
            sandbox_id=self.id,
            pid=pid,
            cmd=cmd,
            args=args,
            cwd=cwd,
            journal=Journal(self.settings.journal_limits),
            stdin=StdinWriter(fds[0]),
            watch=watch,
            kind="pty" if pty is not None else "process",
            pty_fd=fds[2] if pty is not None else None,
            on_output=self._on_activity,
        )
        self.processes[process.process_id] = process
        assert self._tg is not None
        self._tg.start_soon(guarded, lambda: process.run(fds, self.settings))
        return process

    def _require_guest(self) -> Guest:
        if self.guest is None or not self.guest.alive:
            raise GuestGone("sandbox is gone")
        return self.guest

    async def request(self, op: str, **fields: Any) -> tuple[dict[str, Any], list[int]]:
        return await self._require_guest().request(op, **fields)


async def guarded(func: Callable[[], Awaitable[Any]]) -> None:
    """Await ``func()``; log (never raise) its errors so one failure cannot stop the emulator."""
    try:
        await func()
    except Exception:
        log.exception("background task failed")
