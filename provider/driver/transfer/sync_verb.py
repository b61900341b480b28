"""environmentSyncIn / environmentSyncOut's own work: plan the operations, then run them on the
leased sandbox within the call's deadline (docs/protocol.md 5).

A :class:`SyncCall` is made by the verb edge (:mod:`provider.driver.verb_table`); the leased
call (:mod:`provider.driver.leased`) awaits :meth:`SyncCall.plan` once the lease is claimed and
before the work is tracked, so an unusable lease, a bad host path or an oversized batch is
refused before any request; :meth:`SyncCall.run` then moves the files through a
:class:`~provider.driver.transfer.sync.SyncSession`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from provider.driver.core.params import SyncOperation
from provider.driver.core.runtime import DriverRuntime, LeasedCall, deadline
from provider.driver.core.tracker import ScopeKey
from provider.driver.transfer.sync import SyncedOperation, SyncSession
from provider.driver.transfer.sync_files import LogSink
from provider.driver.transfer.sync_plan import Direction, PlannedOperation, plan_sync
from provider.driver.transfer.sync_size import check_sync_sizes


@dataclass
class SyncCall:
    runtime: DriverRuntime
    operations: list[SyncOperation]
    direction: Direction
    planned: list[PlannedOperation] = field(default_factory=list)

    async def plan(self, scope: ScopeKey) -> None:
        """Refuse an unusable lease, then plan and size-check every operation."""
        self.runtime.tracker.check_usable(scope, "sync files")
        self.planned = await plan_sync(self.operations, self.direction)
        check_sync_sizes(self.planned, self.direction)

    async def run(self, leased: LeasedCall, *, log: LogSink) -> list[SyncedOperation]:
        """The planned operations, in order, within the config's timeout."""
        call = leased.call
        records = leased.records
        session = SyncSession(
            leased.client,
            leased.scope.lease_id,
            cleanup_timeout=call.cleanup_bound(call.timeout),
            log=log,
            journal=self.runtime.journal,
            record=records,
            scratches=records,
        )
        with deadline(call.timeout, "The file sync"):
            if self.direction == "in":
                return await session.sync_in(self.planned)
            return await session.sync_out(self.planned)
