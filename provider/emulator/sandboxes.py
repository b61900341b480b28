"""Sandboxes: one row per sandbox, its status machine, timed transitions and view.

Pause freezes every guest process with SIGSTOP (the supervisor, pid 1, sends ``kill(-1, ...)``)
as soon as it is accepted; the status reads ``pausing`` for ``pause_delay_ms``, then ``paused``.
Resume reads ``resuming`` for ``resume_delay_ms``, then SIGCONT and ``running``. Delete kills
pid 1 (the kernel takes the whole namespace with it) before answering.

:class:`Sandbox` builds on :class:`~.sandbox_guest.GuestHost` (the guest, its task group and
managed processes) and owns the parts kept in their own modules: the spec
(``sandbox_spec.py``), the host-side state dir and fork copy (``sandbox_fs.py``, ``files``) and
the idle auto-pause timer (``sandbox_idle.py``, ``idle``), which it runs in its task group and
wakes on every status change.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from .bwrap import GuestRuntime
from .catalog import BANDWIDTH_QUOTA_BYTES
from .ids import new_id, utc_now
from .sandbox_fs import SandboxFiles
from .sandbox_guest import GuestHost, guarded
from .sandbox_idle import IdleTimer
from .sandbox_spec import LIVE, SandboxSpec
from .settings import Settings
from .usernet import LOOPBACK_ONLY


class Sandbox(GuestHost):
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
        network: str = LOOPBACK_ONLY,
    ) -> None:
        sandbox_id = new_id("sb_")
        files = SandboxFiles(state_root / sandbox_id, hostname=spec.name, uid=runtime.drop_to_uid)
        super().__init__(
            sandbox_id,
            spec,
            files=files,
            runtime=runtime,
            settings=settings,
            network=network,
            on_activity=self.touch,
        )
        self.owner = owner
        self.forked_from = forked_from
        self.status = "creating"
        self.created_at = utc_now()
        self.times: dict[str, str] = {}
        high, low = divmod(int.from_bytes(os.urandom(2), "big") % 64000 + 2, 250)
        self.ip = f"10.0.{high}.{low}"
        self.idle = IdleTimer(
            spec,
            settings,
            is_running=lambda: self.status == "running",
            pause=self.pause,
            label=self.id,
        )
        self.paused_mono = 0.0
        self._stale: tuple[str, int] | None = None
        self._transition = 0  # bumps on every accepted transition

    @property
    def live(self) -> bool:
        return self.status in LIVE

    @property
    def can_pause(self) -> bool:
        """A pause is accepted (else 409): running, or already paused."""
        return self.status in ("running", "paused")

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

    def clear_stale(self) -> None:
        self._stale = None

    # -- idle clock ---------------------------------------------------------------------
    def touch(self) -> None:
        """Activity: the idle clock restarts (the timer notices when its deadline comes)."""
        self.idle.touch()

    def rearm(self) -> None:
        """Wake the idle timer: arming, status or time scale changed."""
        self.idle.wake()

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
            self._boot_failed()
            raise
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                await self._boot(tg, supervisor, mounts)
            except BaseException:
                self._boot_failed()
                raise
            self.spawn_ms = int((anyio.current_time() - started) * 1000)
            task_status.started()
            tg.start_soon(guarded, self.idle.run)
            await self._closed.wait()
            tg.cancel_scope.cancel()

    def _boot_failed(self) -> None:
        """The guest did not start: ``failed``, unless the sandbox was deleted meanwhile."""
        if self.status not in ("destroying", "destroyed"):
            self.status = "failed"
        self._closed.set()

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
                await self.files.wait_free()
            if self._transition != token or self.status != expect:
                return
            if thaw:
                await self.freeze(False)
            self._set_status(final)
            self.touch()

        self.start_soon(finish)

    async def force_status(self, status: str) -> None:
        """Admin: set a status directly, freezing or thawing the guest to match."""
        if status in ("paused", "pausing", "error"):
            await self.freeze(True)
        elif status == "running":
            await self.freeze(False)
        self._set_status(status)
        self._stale = None

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
