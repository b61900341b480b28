"""The worker's own search for sandboxes that failed acquires may have created.

A create whose call ended with its outcome open (it was sent, then the deadline or a transport
failure cut it, and the lookup that followed found nothing, or failed) is handed to recovery by
the journal (:meth:`~provider.driver.core.journal.LeaseJournal.abandon_create`). Recovery runs at
the start of calls with the same origin and key, so without a later call the sandbox, if it lands,
would bill until someone looks. :func:`watch_creates` starts a background job of the worker
(:class:`~provider.driver.core.background.BackgroundTasks`) that does what a later call would: it
lists the sandboxes and deletes those carrying an open create's token, then waits and tries
again, with growing pauses, until the journal holds no open create for that origin and key. It
is bounded: the journal stops watching a token
:data:`~provider.driver.core.journal.CREATE_WATCH_SECONDS` after its call ended, and each round is
bounded like recovery. One job runs per origin and key.
"""

from __future__ import annotations

from typing import Final

import anyio

from provider.driver.core.runtime import BoundCall, DriverRuntime
from provider.driver.leases.recovery import RECOVERY_BUDGET, _reap_creates

FIRST_PAUSE: Final = 1.0
"""Seconds before the first round (a create cut on the wire usually lands within this)."""
MAX_PAUSE: Final = 60.0


def watch_creates(runtime: DriverRuntime, call: BoundCall) -> None:
    """Start the background search for ``call``'s origin and key unless one runs already;
    returns at once."""
    key = (call.config.api_url, call.scope("").key_hash)
    if key in runtime.create_watches:
        return
    runtime.create_watches.add(key)
    if not runtime.background.start_soon(lambda: _watch(runtime, call, key)):
        runtime.create_watches.discard(key)


async def _watch(runtime: DriverRuntime, call: BoundCall, key: tuple[str, str]) -> None:
    journal = runtime.journal
    pause = FIRST_PAUSE
    try:
        while True:
            await anyio.sleep(pause)
            tokens = await anyio.to_thread.run_sync(journal.orphan_creates, *key)
            if not tokens:
                return
            async with runtime.client_factory(call.config, call.api_key) as client:
                with anyio.move_on_after(RECOVERY_BUDGET):
                    await _reap_creates(client, journal, set(tokens))
            pause = min(pause * 2, MAX_PAUSE)
    finally:
        runtime.create_watches.discard(key)
