"""Where a lease's managed processes are recorded until they are known to have ended, and its
sync scratch files until they are known to be removed: the journal, so that a worker that
crashed leaves nothing running or stored unseen (:mod:`recovery`)."""

from __future__ import annotations

import anyio

from provider.driver.core.journal import LeaseJournal
from provider.driver.core.tracker import ScopeKey


class JournaledProcesses:
    """Records a lease's started processes in the journal until they are known to have ended,
    and its sync scratch files (``scratch_added`` / ``scratch_removed``) until removed."""

    def __init__(self, journal: LeaseJournal, scope: ScopeKey) -> None:
        self.journal = journal
        self.scope = scope

    async def started(self, process_id: str) -> None:
        await anyio.to_thread.run_sync(self.journal.add_process, self.scope, process_id)

    async def ended(self, process_id: str) -> None:
        await anyio.to_thread.run_sync(self.journal.remove_process, process_id)

    async def scratch_added(self, path: str) -> None:
        await anyio.to_thread.run_sync(self.journal.add_scratch, self.scope, path)

    async def scratch_removed(self, path: str) -> None:
        with anyio.CancelScope(shield=True):  # a row left behind costs a later request
            await anyio.to_thread.run_sync(self.journal.remove_scratch, path)
