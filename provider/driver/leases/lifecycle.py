"""Lease lifecycle after acquire: resume, release, destroy, realize (docs/protocol.md 2.4-2.6,
2.9-2.10). Acquire lives in :mod:`provider.driver.leases.acquire`.

Resume proves the sandbox is still ours (the marker written at acquire) after re-applying the
lease's stored egress list (when the sandbox holds another); a lease whose placement no longer
matches the config is gone without a request. Release keeps a keepable lease
(:mod:`provider.driver.leases.placement`): *warm* (window of 60 s or more: every process tree is
confirmed gone, the sandbox keeps running until CreateOS idle-pauses it) or paused (window 0);
any other lease (one with a deadline included) is deleted, and destroy always deletes. Resume
and the pausing release make no request that the next one makes redundant
(:mod:`provider.driver.leases.running`).
Every refusal happens before the first HTTP request. The ``on_kept`` hook tells the reaper
about kept sandboxes; it must not wait.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.errors import NotFound
from provider.driver.commands.sandbox_ops import (
    SandboxStateError,
    delete_sandbox_confirmed,
    stop_every_tree,
)
from provider.driver.core import gone
from provider.driver.core.params import LeaseIdParams, LeaseParams
from provider.driver.core.runtime import (
    BoundCall,
    DriverRuntime,
    bind_call,
    deadline,
    owned_scope,
)
from provider.driver.core.tracker import ScopeKey
from provider.driver.leases.acquire import MARKER_PATH, LeaseHook
from provider.driver.leases.answers import LeaseAnswer, Realized, Released
from provider.driver.leases.expiry import forget
from provider.driver.leases.placement import (
    egress_in_place,
    is_keepable,
    is_warm,
    placement_changed,
    stored_egress,
)
from provider.driver.leases.recovery import claim_lease
from provider.driver.leases.running import pause_until_paused, read_view, when_running
from provider.errors import RequestRefused

MARKER_RE = re.compile(r"^[0-9a-f-]{36}$")
RESUME_DEADLINE_CAP = 55.0

TeardownHook = Callable[[BoundCall, str], Awaitable[None]]
"""Awaited by release and destroy before the sandbox is touched (closes terminals, channels)."""


# -- resume --------------------------------------------------------------------------------


async def resume(runtime: DriverRuntime, params: LeaseIdParams) -> LeaseAnswer:
    call = bind_call(runtime, params)
    metadata = params.leaseMetadata or {}
    if await runtime.gone.reason(owned_scope(call, params.providerLeaseId, metadata)):
        return LeaseAnswer.gone(call)  # no request: this worker saw the sandbox deleted
    scope = await claim_lease(runtime, call, params.providerLeaseId, metadata)
    runtime.tracker.check_usable(scope, "resume this lease")
    sandbox_id = scope.lease_id
    marker = metadata.get("marker")
    if not isinstance(marker, str) or not MARKER_RE.fullmatch(marker):
        return LeaseAnswer.gone(call)
    egress = stored_egress(metadata)
    if egress is None or placement_changed(call.config, metadata):
        return LeaseAnswer.gone(call)
    async with runtime.client_factory(call.config, call.api_key) as client:
        with deadline(min(call.timeout, RESUME_DEADLINE_CAP), "Resuming the CreateOS sandbox"):
            try:
                view = await read_view(client, sandbox_id)
                if view.status == "destroyed":
                    await runtime.gone.mark(scope, gone.NOT_FOUND)
                if view.status in ("destroyed", "failed"):
                    return LeaseAnswer.gone(call)
                if view.status == "destroying":  # transient: it does not prove the sandbox gone
                    raise SandboxStateError(
                        f"Sandbox {sandbox_id} is destroying and cannot become running.",
                        status=view.status,
                    )
                if not egress_in_place(view.egress, egress):  # before it runs again (2.9.4)
                    await client.put_egress(sandbox_id, egress)
                check = await when_running(
                    client,
                    sandbox_id,
                    view.status,
                    lambda: client.exec(sandbox_id, "/bin/cat", [MARKER_PATH]),
                )
            except NotFound:
                await runtime.gone.mark(scope, gone.NOT_FOUND)
                return LeaseAnswer.gone(call)
    if check.exit_code != 0 or check.stdout != marker:
        return LeaseAnswer.gone(call)
    expires_at = metadata.get("expiresAt")  # a lease with a deadline keeps answering it
    return LeaseAnswer(
        call,
        sandbox_id,
        {**metadata, "resumedLease": True},
        expires_at if isinstance(expires_at, str) else None,
    )


# -- release / destroy ---------------------------------------------------------------------


async def release(
    runtime: DriverRuntime,
    params: LeaseIdParams,
    *,
    destroy: bool,
    on_kept: LeaseHook | None = None,
    before_teardown: TeardownHook | None = None,
) -> Released | None:
    if not params.providerLeaseId:
        return None
    call = bind_call(runtime, params)
    owned = owned_scope(call, params.providerLeaseId, params.leaseMetadata)
    if await runtime.gone.deleted_here(owned):  # deleted already: nothing to do, no request
        return Released(owned.lease_id, "destroyed")
    scope = await claim_lease(runtime, call, params.providerLeaseId, params.leaseMetadata)
    sandbox_id = scope.lease_id
    verb = "destroyed" if destroy else "released"
    async with (
        runtime.tracker.closing(scope, f"the lease was {verb}"),
        runtime.client_factory(call.config, call.api_key) as client,
    ):
        if before_teardown is not None:  # its unconfirmed stops poison the lease (2.5.3)
            await before_teardown(call, sandbox_id)
        if destroy or not is_keepable(call.config, params.leaseMetadata):
            with deadline(call.timeout, "Deleting the CreateOS sandbox"):
                await delete_sandbox_confirmed(client, sandbox_id)
            await runtime.gone.mark(scope, gone.DESTROYED if destroy else gone.RELEASED)
            await runtime.clear_poison(scope)
            await anyio.to_thread.run_sync(runtime.journal.remove_kept_fork, sandbox_id)
            await forget(runtime, sandbox_id)
            return Released(sandbox_id, "destroyed")
        _refuse_if_unconfirmed(runtime, scope)
        try:
            if is_warm(call.config):
                with deadline(call.timeout, "Stopping the lease's processes"):
                    await _stop_every_tree(runtime, client, scope)
            else:
                with deadline(call.timeout, "Pausing the CreateOS sandbox"):
                    await pause_until_paused(client, sandbox_id)
        except NotFound:
            await runtime.gone.mark(scope, gone.NOT_FOUND)
            return Released(sandbox_id, "destroyed")
    if on_kept is not None:
        on_kept(call, sandbox_id)
    return Released(sandbox_id, "stopped")


def _refuse_if_unconfirmed(runtime: DriverRuntime, scope: ScopeKey) -> None:
    if runtime.tracker.is_unconfirmed(scope):
        raise RequestRefused(
            "This lease cannot be kept for reuse: a process on it may still be running "
            "because its cleanup could not be confirmed. Destroy the lease instead."
        )


async def _stop_every_tree(runtime: DriverRuntime, client: CreateOSClient, scope: ScopeKey) -> None:
    """The warm path (2.10.4): the receipt says the run's execution ended, so every process
    tree still alive (a daemon a finished command left behind included) is killed and
    confirmed gone before the sandbox is left running; an unconfirmed kill refuses."""
    if not await stop_every_tree(client, scope.lease_id):
        await runtime.poison(scope)
        _refuse_if_unconfirmed(runtime, scope)


# -- realize -------------------------------------------------------------------------------


async def realize(runtime: DriverRuntime, params: LeaseParams) -> Realized:
    call = bind_call(runtime, params)
    owned_scope(call, params.lease.providerLeaseId, params.lease.metadata)
    return Realized(call)
