"""Idle auto-pause: the per-sandbox timer that pauses an armed ``running`` sandbox left quiet.

A sandbox is *armed* while its spec has ``auto_pause_after_seconds``. Activity (a request naming
it, journaled output of its processes, PATCH, resume, fork) only moves ``last_activity`` forward;
nothing is rescheduled then. The timer task sleeps until the deadline ``last_activity + N *
auto_pause_time_scale`` and re-reads it on waking; it is woken early (:meth:`IdleTimer.wake`)
only when the deadline may have moved *earlier*: arming, a status change, a new time scale. No
polling. The pause itself is the sandbox's normal pause path (README, Idle pause).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import anyio

from .sandbox_spec import SandboxSpec
from .settings import Settings

log = logging.getLogger("provider.emulator")


class IdleTimer:
    """The idle clock and the timer task of one sandbox (run in the sandbox's task group)."""

    def __init__(
        self,
        spec: SandboxSpec,
        settings: Settings,
        *,
        is_running: Callable[[], bool],
        pause: Callable[[], Awaitable[object]],
        label: str,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self._is_running = is_running
        self._pause = pause
        self._label = label  # the sandbox id, for the log line
        self.last_activity = anyio.current_time()
        self._wake = anyio.Event()  # set when the idle deadline may have moved earlier

    @property
    def armed(self) -> bool:
        return self.spec.auto_pause_after_seconds is not None

    def limit_s(self) -> float | None:
        """Seconds of quiet after which an armed running sandbox is paused (time-scaled)."""
        limit = self.spec.auto_pause_after_seconds
        return None if limit is None else limit * self.settings.auto_pause_time_scale

    def touch(self) -> None:
        """Activity: the idle clock restarts (the timer notices when its deadline comes)."""
        self.last_activity = anyio.current_time()

    def wake(self) -> None:
        """Wake the timer: arming, status or time scale changed (activity only moves the
        deadline later, which the timer finds out when it wakes)."""
        self._wake.set()

    async def pause_now(self) -> bool:
        """Pause now as the timer would; False (nothing done) unless armed and running."""
        if not self.armed or not self._is_running():
            return False
        await self._pause()
        return True

    async def run(self) -> None:
        """Sleep until the idle deadline (or a wake-up), then pause; no polling."""
        while True:
            limit = self.limit_s()
            if limit is None or not self._is_running():
                await self._sleep_until_woken(math.inf)
                continue
            left = self.last_activity + limit - anyio.current_time()
            if left > 0:
                await self._sleep_until_woken(left)
                continue
            log.info("sandbox %s idle for %.3g s: pausing", self._label, limit)
            await self._pause()

    async def _sleep_until_woken(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self._wake.wait()
        self._wake = anyio.Event()  # no await since the wait: no wake-up is lost
