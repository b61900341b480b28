"""The environment-driver method table the dispatcher serves (``method_table``), the driver's
shutdown hook, and ``background()``, which the composition root runs around serving so that
background work (the reaper's sweeps) lives as long as the worker.

The table is built from the names in :mod:`provider.verbs` alone, and each handler imports
:mod:`provider.driver.service` (pydantic, httpx, the CreateOS client) on its first call, so the
worker answers ``initialize`` fast. Verbs are not added here: each is declared once, as a row of
:mod:`provider.driver.verb_table` (its docstring says how to add one), with its name in
:mod:`provider.verbs`; a test holds the two together.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from provider.verbs import SERVED_VERBS
from provider.worker_env import API_KEY_ENV

if TYPE_CHECKING:
    from provider.driver.core.background import BackgroundTasks
    from provider.driver.core.runtime import DriverRuntime
    from provider.driver.service import DriverService

MethodHandler = Callable[[dict[str, Any]], Awaitable[Any]]
Notify = Callable[[str, dict[str, Any]], Awaitable[None]]
Log = Callable[[str, str, dict[str, Any] | None], Awaitable[None]]

#: The verbs this worker serves, in ``supportedMethods`` order (:mod:`provider.verbs`).
VERBS: tuple[str, ...] = SERVED_VERBS

_service: DriverService | None = None
_background: BackgroundTasks | None = None
_runtime: DriverRuntime | None = None


def _background_tasks() -> BackgroundTasks:
    global _background
    if _background is None:
        from provider.driver.core.background import BackgroundTasks

        _background = BackgroundTasks()
    return _background


@asynccontextmanager
async def background() -> AsyncIterator[None]:
    """Run the driver's background tasks for the duration of the block (the worker's life);
    the first one deletes leases whose deadline passed while no worker ran (those it can)."""
    tasks = _background_tasks()
    async with tasks.running():
        tasks.start_soon(_expired_at_start)
        yield


async def _expired_at_start() -> None:
    """Only a worker with a key of its own can act before a call brings a config: any other
    starts without loading the driver or opening its journal (the first call does that)."""
    if not os.environ.get(API_KEY_ENV, "").strip():
        return
    from provider.driver.leases.expiry import delete_expired_at_start

    await delete_expired_at_start(_driver_runtime())


def _driver_runtime() -> DriverRuntime:
    global _runtime
    if _runtime is None:
        from provider.driver.core.runtime import DriverRuntime
        from provider.driver.core.state_folder import open_journal

        _runtime = DriverRuntime(journal=open_journal(), background=_background_tasks())
    return _runtime


def _service_for(notify: Notify, log: Log) -> DriverService:
    global _service
    if _service is None:
        from provider.driver.service import DriverService

        _service = DriverService(_driver_runtime(), notify=notify, log=log)
    return _service


def method_table(notify: Notify, log: Log) -> dict[str, MethodHandler]:
    """Map of JSON-RPC method name to handler; ``notify``/``log`` reach the host."""

    def lazy(verb: str) -> MethodHandler:
        async def handler(params: dict[str, Any]) -> Any:
            return await _service_for(notify, log).table()[verb](params)

        return handler

    return {verb: lazy(verb) for verb in VERBS}


async def shutdown() -> None:
    """Abort active driver work and wait for its cleanup (bounded inside the tracker)."""
    if _service is not None:
        await _service.shutdown()
    elif _background is not None:
        _background.cancel()
