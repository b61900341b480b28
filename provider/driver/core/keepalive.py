"""Keepalive reads for warm leases (docs/protocol.md 2.10.6).

A warm lease's sandbox is created with ``auto_pause_after_seconds``: CreateOS pauses it once it
has been idle that long. A command that prints nothing for longer (a build, a model call) must
not be paused under it, so while work runs on such a lease (a command, a sync, a terminal, a
channel) the worker reads ``GET /v1/sandboxes/{id}`` at least every ``min(window / 2, 240)`` s,
which counts as activity. The loop runs as background work and stops with the operation; a
failed read is ignored (the operation itself reports real trouble).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio

from provider.config_fields import MIN_AUTO_PAUSE_SECONDS
from provider.createos.client import CreateOSClient
from provider.driver.core.background import BackgroundTasks
from provider.errors import ProviderError

MAX_INTERVAL: Final = 240.0


def default_interval(window: int) -> float:
    return min(window / 2, MAX_INTERVAL)


def warm_window(metadata: Mapping[str, Any] | None) -> int | None:
    """The window of a reusable lease created with one (at least 60 s), else None."""
    meta = metadata or {}
    window = meta.get("autoPauseAfterSeconds")
    if meta.get("reuseLease") is not True or isinstance(window, bool):
        return None
    if isinstance(window, int) and window >= MIN_AUTO_PAUSE_SECONDS:
        return window
    return None


@asynccontextmanager
async def keepalive(
    background: BackgroundTasks,
    client: CreateOSClient,
    sandbox_id: str,
    window: int | None,
    interval: Callable[[int], float] = default_interval,
) -> AsyncIterator[None]:
    """Read the sandbox every ``interval(window)`` seconds while the block runs (nothing when
    ``window`` is None)."""
    if window is None:
        yield
        return
    scope = anyio.CancelScope()
    period = interval(window)

    async def reads() -> None:
        with scope:
            while True:
                await anyio.sleep(period)
                with contextlib.suppress(ProviderError):
                    await client.get_sandbox(sandbox_id)

    background.start_soon(reads)
    try:
        yield
    finally:
        scope.cancel()  # also before the job started: entering a cancelled scope ends it
