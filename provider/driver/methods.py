"""The environment-driver method table the dispatcher serves (``method_table``) and the driver's
shutdown hook.

The table is built from names alone and each handler imports :mod:`provider.driver.service`
(pydantic, httpx, the CreateOS client) on its first call, so the worker answers ``initialize``
fast; keep it that way when adding verbs here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from provider.driver.service import DriverService

MethodHandler = Callable[[dict[str, Any]], Awaitable[Any]]
Notify = Callable[[str, dict[str, Any]], Awaitable[None]]
Log = Callable[[str, str, dict[str, Any] | None], Awaitable[None]]

#: The environment verbs this worker implements, in the order ``supportedMethods`` lists them.
VERBS: tuple[str, ...] = (
    "environmentValidateConfig",
    "environmentProbe",
    "environmentAcquireLease",
    "environmentResumeLease",
    "environmentReleaseLease",
    "environmentDestroyLease",
    "environmentRealizeWorkspace",
    "environmentExecute",
    "environmentSyncIn",
    "environmentSyncOut",
)

_service: DriverService | None = None


def _service_for(notify: Notify, log: Log) -> DriverService:
    global _service
    if _service is None:
        from provider.driver.journal import open_journal
        from provider.driver.runtime import DriverRuntime
        from provider.driver.service import DriverService

        _service = DriverService(DriverRuntime(journal=open_journal()), notify=notify, log=log)
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
