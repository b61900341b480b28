"""The Paperclip environment-driver methods: raw params in, JSON-ready results out.

``DriverService`` is what ``provider.driver.methods`` hands every call to. It serves the rows of
:data:`~provider.driver.verb_table.VERB_TABLE` (each decodes its params and runs its handler
with the service's :class:`~provider.driver.context.DriverContext`) and shuts the driver down. It
knows nothing of JSON-RPC framing; the functions it is given (``notify``, ``log``) send host
notifications for it. Its :class:`Reaper` sweeps kept sandboxes in the runtime's background tasks
after reusable acquires and kept releases.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import anyio

from provider.driver.context import DriverContext
from provider.driver.core.runtime import DriverRuntime
from provider.driver.interactive.hub import Interactive
from provider.driver.interactive.sessions import Log, Notify
from provider.driver.leases.reaper import Reaper
from provider.driver.verb_table import BY_SHORT_NAME, VERB_TABLE

Handler = Callable[[dict[str, Any]], Coroutine[Any, Any, Any]]
SHUTDOWN_BUDGET = 8.0


class DriverService:
    def __init__(
        self, runtime: DriverRuntime, *, notify: Notify, log: Log, reaper: Reaper | None = None
    ) -> None:
        reaper = reaper if reaper is not None else Reaper(runtime, log)
        self.context = DriverContext(runtime, notify, log, reaper)
        self.runtime, self.notify, self.log = runtime, notify, log
        self.interactive: Interactive = self.context.interactive
        self._table: dict[str, Handler] = {
            verb.name: partial(verb.handle, self.context) for verb in VERB_TABLE
        }

    def table(self) -> dict[str, Handler]:
        """The method table: each served verb's name to its handler of raw params."""
        return self._table

    def __getattr__(self, short: str) -> Handler:
        """In-process callers (tests, benches) call a verb by its row's short name:
        ``service.execute(params)`` is ``environmentExecute``."""
        verb = BY_SHORT_NAME.get(short)
        if verb is None:
            raise AttributeError(f"{type(self).__name__} has no attribute or verb {short!r}")
        return self._table[verb.name]

    async def shutdown(self) -> None:
        """Cancel tracked work and close every terminal and channel, within one budget."""
        runtime, interactive = self.runtime, self.interactive
        runtime.tracker.shutting_down = True  # opens refuse from here on
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: runtime.tracker.shutdown(budget=SHUTDOWN_BUDGET))
            with anyio.move_on_after(SHUTDOWN_BUDGET):
                await interactive.close_all()
        interactive.registry.clear()
        runtime.background.cancel()  # a sweep in flight is housekeeping: drop it
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            await runtime.pool.aclose()  # the work is over: close the shared connections
