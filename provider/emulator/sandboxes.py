"""Sandboxes: host-side state dir, the bwrap guest, the state machine and timed transitions.

Pause freezes every guest process with SIGSTOP (the supervisor, pid 1, sends ``kill(-1, ...)``)
as soon as it is accepted; the status reads ``pausing`` for ``pause_delay_ms``, then ``paused``.
Resume reads ``resuming`` for ``resume_delay_ms``, then SIGCONT and ``running``. Delete kills
pid 1 (the kernel takes the whole namespace with it) before answering.

Network: a sandbox whose egress list at create (or fork) is restrictive runs in its own network
namespace (loopback only), chosen once and kept for its life (``isolated_net``). Idle pause: one
timer task per sandbox sleeps until the idle deadline of an armed ``running`` sandbox (woken
when that deadline may have moved earlier) and then pauses it through :meth:`Sandbox.pause`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from .bwrap import GUEST_PATH, HOME_BIN, GuestRuntime, write_guest_etc
from .catalog import BANDWIDTH_QUOTA_BYTES, DEFAULT_DISK_MIB
from .guest import ChildWatch, Guest, GuestGone
from .ids import new_id, utc_now
from .images import image_mounts
from .journal import Journal
from .processes import ManagedProcess, StdinWriter
from .settings import Settings

log = logging.getLogger("provider.emulator")

GUEST_TREES = ("paperclip-workspace", "tmp", "root")
LIVE = ("creating", "running", "pausing", "paused", "resuming", "forking", "error")
TRANSITIONAL = ("creating", "pausing", "resuming", "forking", "destroying")


def egress_restricts(egress: list[str] | None) -> bool:
    """Whether a (normalized) egress list limits traffic: non-empty and without ``*`` (absent,
    ``[]`` and ``["*"]`` allow everything; a list holding ``*`` does too)."""
    return bool(egress) and "*" not in (egress or [])


@dataclass
class SandboxSpec:
    """Validated create fields."""

    shape: str
    vcpu: int
    mem_mib: int
    rootfs: str
    region: str
    name: str
    disk_mib: int = DEFAULT_DISK_MIB
    egress: list[str] | None = None
    envs: dict[str, str] = field(default_factory=dict)
    auto_pause_after_seconds: int | None = None
    ingress_enabled: bool = False
    image_root: Path | None = None  # folder of the rootfs image (None = plain host view)


class Sandbox:
    """One sandbox row and, while live, its guest."""

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        owner: str,
        state_root: Path,
        runtime: GuestRuntime,
        settings: Settings,
        forked_from: str | None = None,
        isolated_net: bool = False,
    ) -> None:
        self.id = new_id("sb_")
        self.spec = spec
        self.owner = owner
        self.state_dir = state_root / self.id
        self.runtime = runtime
        self.settings = settings
        self.forked_from = forked_from
        # Own network namespace (loopback only): decided at create or fork, never changed.
        self.isolated_net = isolated_net
        self.status = "creating"
        self.created_at = utc_now()
        self.times: dict[str, str] = {}
        high, low = divmod(int.from_bytes(os.urandom(2), "big") % 64000 + 2, 250)
        self.ip = f"10.0.{high}.{low}"
        self.spawn_ms = 0
        self.guest: Guest | None = None
        self.processes: dict[str, ManagedProcess] = {}
        self.last_activity = anyio.current_time()
        self._idle_wake = anyio.Event()  # set when the idle deadline may have moved earlier
        self.paused_mono = 0.0
        self._fs_holds = 0  # fork copies reading (source) or writing (child) the guest trees
        self._fs_free = anyio.Event()
        self._fs_free.set()
        self._stale: tuple[str, int] | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = anyio.Event()
        self._transition = 0  # bumps on every accepted transition

    # -- paths --------------------------------------------------------------------------
    @property
    def fs_dir(self) -> Path:
        return self.state_dir / "fs"

    @property
    def live(self) -> bool:
        return self.status in LIVE

    @property
    def closed(self) -> bool:
        """Killed (deleted, reset or shut down): it must not boot again."""
        return self._closed.is_set()

    # -- views --------------------------------------------------------------------------
    def view(self, *, reader: bool = False) -> dict[str, Any]:
        status = self.status
        if reader and self._stale is not None:
            old, left = self._stale
            status = old
            self._stale = (old, left - 1) if left > 1 else None
        spec = self.spec
        out: dict[str, Any] = {
            "id": self.id,
            "status": status,
            "vcpu": spec.vcpu,
            "mem_mib": spec.mem_mib,
            "disk_mib": spec.disk_mib,
            "created_at": self.created_at,
            "ingress_enabled": spec.ingress_enabled,
            "name": spec.name,
            "shape": spec.shape,
            "rootfs": spec.rootfs,
            "region": spec.region,
            "egress": list(spec.egress or []),
            "envs": sorted(spec.envs),
        }
        if status not in ("destroyed", "failed"):
            out["ip"] = self.ip
        out.update(self.times)
        if self.forked_from is not None:
            out["forked_from"] = self.forked_from
        if spec.auto_pause_after_seconds is not None:
            out["auto_pause_after_seconds"] = spec.auto_pause_after_seconds
        return out

    def create_view(self) -> dict[str, Any]:
        out = self.view()
        out["spawn_ms"] = self.spawn_ms
        out["bandwidth_quota_bytes"] = BANDWIDTH_QUOTA_BYTES
        return out

    def _set_status(self, status: str, *, stale: bool = False) -> None:
        old = self.status
        self.status = status
        self._transition += 1
        if stale and self.settings.stale_reads > 0:
            self._stale = (old, self.settings.stale_reads)
        stamp = {
            "running": "running_at",
            "paused": "paused_at",
            "destroyed": "destroyed_at",
        }.get(status)
        if stamp is not None:
            self.times[stamp] = utc_now()
        if status == "running" and old == "resuming":
            self.times["last_resumed_at"] = utc_now()
        if status == "paused":
            self.paused_mono = anyio.current_time()
        self.rearm()

    def touch(self) -> None:
        """Activity: the idle clock restarts (the timer notices when its deadline comes)."""
        self.last_activity = anyio.current_time()

    # -- lifecycle ----------------------------------------------------------------------
    async def run(
        self,
        *,
        supervisor: Path,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Own the sandbox's task group until it is destroyed; boots the guest first."""
        started = anyio.current_time()
        try:
            # Planned outside the task group so that an ImageError reaches the caller as is.
            mounts = await anyio.to_thread.run_sync(self._image_mounts)
        except BaseException:
            self.status = "failed"
            self._closed.set()
            raise
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                await self._boot(tg, supervisor, mounts)
            except BaseException:
                self.status = "failed"
                self._closed.set()
                raise
            self.spawn_ms = int((anyio.current_time() - started) * 1000)
            task_status.started()
            tg.start_soon(guarded, self._idle_timer)
            await self._closed.wait()
            tg.cancel_scope.cancel()

    def _image_mounts(self) -> list[str]:
        """bwrap overlay of the sandbox's image, read at every boot (the folder may change)."""
        root = self.spec.image_root
        return [] if root is None else image_mounts(root, self.spec.rootfs)

    async def _boot(self, tg: anyio.abc.TaskGroup, supervisor: Path, mounts: list[str]) -> None:
        await anyio.to_thread.run_sync(self._prepare_dirs)
        guest = Guest(self.runtime)
        self.guest = guest
        await guest.start(
            tg,
            fs_dir=self.fs_dir,
            etc_dir=self.state_dir / "etc",
            supervisor=supervisor,
            hostname=self.spec.name,
            log_path=self.state_dir / "supervisor.log",
            unshare_net=self.isolated_net,
            image_mounts=mounts,
        )

    def _prepare_dirs(self, *, seed_home: bool = True) -> None:
        """Create the state dir and the guest trees; a freshly created HOME gets an empty
        ``.local/bin`` (first on the login ``PATH``) unless ``seed_home`` is false (a fork
        target, whose HOME is copied from its source)."""
        uid = self.runtime.drop_to_uid
        for path in (self.state_dir, self.fs_dir):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o711)
        for tree in GUEST_TREES:
            path = self.fs_dir / tree
            fresh = not path.exists()
            path.mkdir(exist_ok=True)
            path.chmod(0o700)
            if uid is not None:
                os.chown(path, uid, uid)
            if tree == "root" and fresh and seed_home:
                # Only into a tree just made: the guest cannot have planted a symlink yet.
                _guest_mkdirs(path, HOME_BIN, uid)
        write_guest_etc(self.state_dir / "etc", self.spec.name)

    def start_soon(self, func: Callable[[], Awaitable[Any]]) -> None:
        """Run ``func`` in the sandbox's task group; its errors are logged, never propagated."""
        if self._tg is not None and not self._closed.is_set():
            self._tg.start_soon(guarded, func)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # -- transitions --------------------------------------------------------------------
    def mark_running(self) -> None:
        self._set_status("running")
        self.touch()

    def mark_paused(self) -> None:
        self._set_status("paused")

    async def pause(self) -> int:
        """Accept a pause: 202 when started, 200 when already paused (409 raised by caller)."""
        if self.status == "paused":
            return 200
        self._set_status("pausing", stale=True)
        await self.freeze(True)
        self._after(self.settings.pause_delay_ms, "pausing", "paused")
        return 202

    async def resume(self) -> int:
        if self.status == "running":
            return 200
        self._set_status("resuming", stale=True)
        self._after(self.settings.resume_delay_ms, "resuming", "running", thaw=True)
        return 202

    def _after(self, delay_ms: int, expect: str, final: str, *, thaw: bool = False) -> None:
        token = self._transition

        async def finish() -> None:
            await anyio.sleep(delay_ms / 1000)
            if thaw:  # a fork still copying this sandbox's files sees them unchanged
                await self._fs_free.wait()
            if self._transition != token or self.status != expect:
                return
            if thaw:
                await self.freeze(False)
            self._set_status(final)
            self.touch()

        self.start_soon(finish)

    async def freeze(self, stop: bool) -> None:
        if self.guest is not None:
            with contextlib.suppress(GuestGone):
                await self.guest.request("freeze", stop=stop)

    async def force_status(self, status: str) -> None:
        """Admin: set a status directly, freezing or thawing the guest to match."""
        if status in ("paused", "pausing", "error"):
            await self.freeze(True)
        elif status == "running":
            await self.freeze(False)
        self._set_status(status)
        self._stale = None

    async def kill_guest(self) -> None:
        """Kill every process of the sandbox now (idempotent)."""
        with anyio.CancelScope(shield=True):
            if self.guest is not None:
                await self.guest.kill()
                self.guest.close()
            self._closed.set()

    def remove_state(self) -> None:
        """Delete the host-side state dir (blocking; run in a thread)."""

        def onerror(func: Any, path: str, _exc: Any) -> None:
            with contextlib.suppress(OSError):
                Path(path).parent.chmod(0o700)
                Path(path).chmod(0o700)
                func(path)

        if self.state_dir.exists():
            shutil.rmtree(self.state_dir, onerror=onerror)

    def hold_fs(self) -> None:
        """A fork copy starts using this sandbox's trees (see :meth:`wait_fs_free`)."""
        if self._fs_holds == 0:
            self._fs_free = anyio.Event()
        self._fs_holds += 1

    def release_fs(self) -> None:
        self._fs_holds -= 1
        if self._fs_holds == 0:
            self._fs_free.set()

    async def wait_fs_free(self) -> None:
        """Until no fork copy uses the trees (state removal and the thaw of a resume wait)."""
        await self._fs_free.wait()

    def copy_fs_to(self, other: Sandbox) -> None:
        """Copy the guest trees into ``other`` (blocking; run as the guest uid on root hosts)."""
        other._prepare_dirs(seed_home=False)
        kwargs: dict[str, Any] = {}
        uid = self.runtime.drop_to_uid
        if uid is not None:
            kwargs = {"user": uid, "group": uid, "extra_groups": []}
        for tree in GUEST_TREES:
            src, dst = self.fs_dir / tree, other.fs_dir / tree
            subprocess.run(
                ["cp", "-a", "--", f"{src}/.", f"{dst}/"],
                check=True,
                capture_output=True,
                **kwargs,
            )

    def begin_destroy(self) -> str:
        """Status answered by DELETE: ``destroyed`` at once from paused/error, else destroying."""
        if self.status in ("paused", "error", "failed"):
            self._set_status("destroyed")
        else:
            self._set_status("destroying")
        return self.status

    def finish_destroy(self) -> None:
        if self.status != "destroyed":
            self._set_status("destroyed")

    def clear_stale(self) -> None:
        self._stale = None

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
            on_output=self.touch,
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

    # -- idle auto-pause ---------------------------------------------------------------
    @property
    def armed(self) -> bool:
        return self.spec.auto_pause_after_seconds is not None

    def idle_limit_s(self) -> float | None:
        """Seconds of quiet after which an armed running sandbox is paused (time-scaled)."""
        limit = self.spec.auto_pause_after_seconds
        return None if limit is None else limit * self.settings.auto_pause_time_scale

    def rearm(self) -> None:
        """Wake the idle timer: arming, status or time scale changed (activity only moves the
        deadline later, which the timer finds out when it wakes)."""
        self._idle_wake.set()

    async def idle_pause_now(self) -> bool:
        """Pause now as the idle timer would; False (nothing done) unless armed and running."""
        if not self.armed or self.status != "running":
            return False
        await self.pause()
        return True

    async def _idle_timer(self) -> None:
        """Sleep until the idle deadline (or a wake-up), then pause; no polling."""
        while True:
            limit = self.idle_limit_s()
            if limit is None or self.status != "running":
                await self._sleep_until_woken(math.inf)
                continue
            left = self.last_activity + limit - anyio.current_time()
            if left > 0:
                await self._sleep_until_woken(left)
                continue
            log.info("sandbox %s idle for %.3g s: pausing", self.id, limit)
            await self.pause()

    async def _sleep_until_woken(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self._idle_wake.wait()
        self._idle_wake = anyio.Event()  # no await since the wait: no wake-up is lost


def _guest_mkdirs(base: Path, relative: str, uid: int | None) -> None:
    """``mkdir -p base/relative`` (mode 0755), each new directory owned by the guest uid."""
    path = base
    for part in Path(relative).parts:
        path = path / part
        path.mkdir(exist_ok=True)
        path.chmod(0o755)  # whatever the umask
        if uid is not None:
            os.chown(path, uid, uid, follow_symlinks=False)


async def guarded(func: Callable[[], Awaitable[Any]]) -> None:
    """Await ``func()``; log (never raise) its errors so one failure cannot stop the emulator."""
    try:
        await func()
    except Exception:
        log.exception("background task failed")
