"""What every verb handler is given (:class:`DriverContext`), and the one leased call.

:meth:`DriverContext.leased` is the preamble of every verb that works on an existing lease
(execute, sync in, sync out): refuse, without a request, a lease this worker saw deleted; claim
it (ownership, crash recovery, a journaled poison mark); register it for terminal and channel
opens (docs/protocol.md 2.12); then, around the verb's own work, track the operation (so
release and shutdown can cancel it), open the client, keep a warm lease awake
(docs/protocol.md 2.10.6), poison the lease when a cleanup stays unconfirmed and mark it gone
on a 404. The caller binds the call first (:meth:`DriverContext.bind`, the one parse of its
config) so that it can refuse bad values before the claim.

It lives above the wings because it joins them: leases (the claim), interactive (registration)
and core.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio

from provider.driver.core.keepalive import keepalive, warm_window
from provider.driver.core.params import CallParams, Lease
from provider.driver.core.runtime import (
    BoundCall,
    DriverRuntime,
    LeasedCall,
    bind_call,
    owned_scope,
)
from provider.driver.core.tracker import ScopeKey
from provider.driver.interactive.channels import DuplexChannels
from provider.driver.interactive.hub import Interactive
from provider.driver.interactive.login import LoginTerminals
from provider.driver.interactive.registry import LeaseRef
from provider.driver.interactive.sessions import Log, Notify
from provider.driver.leases.reaper import Reaper
from provider.driver.leases.recovery import claim_lease
from provider.errors import CleanupUnconfirmed


@dataclass
class DriverContext:
    runtime: DriverRuntime
    notify: Notify
    log: Log
    reaper: Reaper
    interactive: Interactive = field(init=False)
    login: LoginTerminals = field(init=False)
    channels: DuplexChannels = field(init=False)

    def __post_init__(self) -> None:
        self.interactive = Interactive(self.runtime, notify=self.notify, log=self.log)
        self.login = LoginTerminals(self.interactive)
        self.channels = DuplexChannels(self.interactive)

    def bind(self, params: CallParams) -> BoundCall:
        return bind_call(self.runtime, params)

    def register(self, call: BoundCall, lease_id: str | None, metadata: object) -> None:
        """2.12: an owned call (re)registers its lease for terminal and channel opens."""
        if lease_id:
            window = warm_window(metadata if isinstance(metadata, dict) else None)
            self.interactive.register(call, lease_id, window)

    async def close_sessions(self, call: BoundCall, lease_id: str) -> None:
        """Release and destroy: forget the lease, then close its terminals and channels."""
        self.interactive.forget(call, lease_id)
        await self.interactive.close_lease(LeaseRef(call.company_id, call.environment_id, lease_id))

    @asynccontextmanager
    async def leased(
        self,
        call: BoundCall,
        lease: Lease,
        operation: str,
        *,
        before_work: Callable[[ScopeKey], Awaitable[None]] | None = None,
    ) -> AsyncIterator[LeasedCall]:
        """The leased call (module docstring); ``operation`` names the tracked work in
        refusals, ``before_work`` runs once the lease is claimed, before it is tracked."""
        runtime = self.runtime
        await runtime.gone.refuse(owned_scope(call, lease.providerLeaseId, lease.metadata))
        scope = await claim_lease(runtime, call, lease.providerLeaseId, lease.metadata)
        self.register(call, scope.lease_id, lease.metadata)
        if before_work is not None:
            await before_work(scope)
        window, interval = warm_window(lease.metadata), runtime.keepalive_interval
        async with (
            runtime.tracker.track(scope, operation),
            runtime.client_factory(call.config, call.api_key) as client,
            keepalive(runtime.background, client, scope.lease_id, window, interval),
            self._poison_on_unconfirmed(scope),
            runtime.gone.on_not_found(scope),
        ):
            yield LeasedCall(runtime, call, scope, client)

    @asynccontextmanager
    async def _poison_on_unconfirmed(self, scope: ScopeKey) -> AsyncIterator[None]:
        """Poison the lease (memory and journal) when CleanupUnconfirmed leaves the block."""
        try:
            yield
        except CleanupUnconfirmed:
            with anyio.CancelScope(shield=True):
                await self.runtime.poison(scope)
            raise
