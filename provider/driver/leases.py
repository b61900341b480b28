"""Lease lifecycle: acquire, resume, release, destroy, realize (provider-behavior.md 2.3-2.6).

A lease is one CreateOS sandbox. Acquire creates it with a unique name token
(``pc-<scope tag>-<uuid>``), waits for ``running``, prepares the workspace and writes a random
marker; resume proves the sandbox is still ours by reading that marker back; release pauses a
keepable lease (:mod:`provider.driver.reuse`) and deletes any other; destroy always deletes.
Every refusal happens before the first HTTP request. The ``on_reusable`` / ``on_kept`` hooks
tell the caller (the reaper) about kept sandboxes; they must not wait.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.errors import APIStatusError, NotFound, RateLimited
from provider.driver.journal import LeaseJournal
from provider.driver.params import AcquireParams, LeaseIdParams, LeaseParams
from provider.driver.recovery import claim_lease, recover_orphans
from provider.driver.reuse import is_keepable, is_reusable, name_token, scope_tag
from provider.driver.runtime import (
    PROVIDER_NAME,
    ROOT,
    BoundCall,
    DriverRuntime,
    bind_call,
    deadline,
    owned_scope,
)
from provider.driver.sandbox_ops import delete_sandbox_confirmed, read_status, transition
from provider.errors import CleanupUnconfirmed, ProviderError, RequestRefused

MARKER_DIR = f"{ROOT}/.paperclip-runtime"
MARKER_PATH = f"{MARKER_DIR}/.paperclip-createos-lease"
MARKER_RE = re.compile(r"^[0-9a-f-]{36}$")
RESUME_DEADLINE_CAP = 55.0
CLEANUP_DEADLINE_CAP = 60.0
GONE: dict[str, Any] = {"providerLeaseId": None, "metadata": {"expired": True}}

LeaseHook = Callable[[BoundCall, str], None]
"""Told the call and the lease id of a reusable or kept lease; returns at once."""
TeardownHook = Callable[[BoundCall, str], Awaitable[None]]
"""Awaited by release and destroy before the sandbox is touched (closes terminals, channels)."""


# -- acquire -------------------------------------------------------------------------------


async def acquire(
    runtime: DriverRuntime, params: AcquireParams, *, on_reusable: LeaseHook | None = None
) -> dict[str, Any]:
    if params.requestedExpiresAt:
        raise RequestRefused(
            "CreateOS cannot bound a lease's lifetime (it has no hard expiry), so a lease with "
            "requestedExpiresAt cannot be honoured."
        )
    call = bind_call(runtime, params)
    reusable = is_reusable(call.config, params.executionWorkspaceId, params.agentId)
    await recover_orphans(runtime, call)
    async with runtime.client_factory(call.config, call.api_key) as client:
        with deadline(call.timeout, "Acquiring a CreateOS sandbox"):
            sandbox_id, marker = await provision_sandbox(client, call, runtime.journal)
    if reusable and on_reusable is not None:
        on_reusable(call, sandbox_id)
    return {
        "providerLeaseId": sandbox_id,
        "metadata": lease_metadata(call, marker, reusable=reusable),
        "expiresAt": None,
    }


def lease_metadata(call: BoundCall, marker: str, *, reusable: bool) -> dict[str, Any]:
    config = call.config
    return {
        "provider": PROVIDER_NAME,
        "apiUrl": config.api_url,
        "companyId": call.company_id,
        "environmentId": call.environment_id,
        "remoteCwd": ROOT,
        "shellCommand": "bash",
        "marker": marker,
        "shape": config.shape,
        "rootfs": config.rootfs,
        "region": config.region,
        "reuseLease": reusable,
    }


async def provision_sandbox(
    client: CreateOSClient, call: BoundCall, journal: LeaseJournal
) -> tuple[str, str]:
    """Create a sandbox, bring it to ``running`` and prepare the workspace and marker.

    Runs under the caller's deadline. Whatever fails after the create deletes the sandbox again
    (under a fresh, shielded deadline) before the error propagates. The create's name token is
    journaled until the outcome is settled, so a worker crash in between cannot leak it. When
    the outcome stays open (a create that may still land after its lookup found nothing, or a
    cleanup that failed), the token is handed to recovery, which keeps looking for the sandbox
    on later calls with this origin and key (:meth:`LeaseJournal.abandon_create`).
    """
    token = name_token(scope_tag(call.company_id, call.environment_id, call.config.api_url))
    key_hash = call.scope("").key_hash
    await anyio.to_thread.run_sync(journal.add_create, call.config.api_url, key_hash, token)
    unresolved = False

    def mark_unresolved() -> None:
        nonlocal unresolved
        unresolved = True

    try:
        return await _provision(client, call, token, mark_unresolved)
    except CleanupUnconfirmed:
        unresolved = True
        raise
    finally:
        with anyio.CancelScope(shield=True):
            settle = journal.abandon_create if unresolved else journal.remove_create
            await anyio.to_thread.run_sync(settle, token)


async def _provision(
    client: CreateOSClient, call: BoundCall, token: str, mark_unresolved: Callable[[], None]
) -> tuple[str, str]:
    sandbox_id, status = await create_sandbox(client, call, token, on_unresolved=mark_unresolved)
    try:
        if status != "running":  # a create that answered running needs no read to confirm it
            await transition(client, sandbox_id, "running")
        # One request prepares the workspace and writes the marker (36 bytes, no newline): the
        # marker is a fresh UUID (hex and dashes only), so it needs no quoting.
        marker = str(uuid.uuid4())
        script = f"mkdir -p -- '{MARKER_DIR}' && printf '%s' '{marker}' > '{MARKER_PATH}'"
        prepared = await client.exec(sandbox_id, "/bin/bash", ["-lc", script])
        if prepared.exit_code != 0:
            raise ProviderError(
                f"Could not prepare {ROOT} in the sandbox (exit code {prepared.exit_code}); the "
                "image must provide bash and coreutils."
            )
    except BaseException as exc:
        await _delete_after_failure(client, sandbox_id, call, exc)
        raise
    return sandbox_id, marker


async def create_sandbox(
    client: CreateOSClient,
    call: BoundCall,
    token: str,
    *,
    on_unresolved: Callable[[], None] | None = None,
) -> tuple[str, str | None]:
    """POST the sandbox (its id and the status it answered); when the outcome is unknown, find
    it by its name token and delete it.

    ``on_unresolved`` is called when the lookup found nothing: the create may still land later
    (a request that timed out on our side can still be served), so absence proves nothing yet.
    """
    config = call.config
    try:
        return await client.create_sandbox_status(
            shape=config.shape, name=token, rootfs=config.rootfs, region=config.region
        )
    except APIStatusError as exc:
        if isinstance(exc, RateLimited) or exc.status < 500:
            raise  # a definite rejection: nothing was created
        found = await _reap_by_name(client, token, call, exc)
        if not found and on_unresolved is not None:
            on_unresolved()
        raise
    except BaseException as exc:
        # Transport failure, malformed answer, deadline or cancellation mid-call: unknown outcome.
        found = await _reap_by_name(client, token, call, exc)
        if not found and on_unresolved is not None:
            on_unresolved()
        raise


async def _reap_by_name(
    client: CreateOSClient, token: str, call: BoundCall, cause: BaseException
) -> bool:
    """After a create with an unknown outcome: delete any sandbox carrying our name token.

    Answers whether one was found (and deleted); raises :class:`CleanupUnconfirmed` when the
    lookup or the delete failed.
    """
    confirmed = found = False
    with anyio.CancelScope(shield=True), anyio.move_on_after(_cleanup_timeout(call)):
        try:
            for view in await client.list_sandboxes():
                if view.name == token:
                    found = True
                    await delete_sandbox_confirmed(client, view.id)
            confirmed = True
        except ProviderError:
            pass
    if not confirmed:
        reason = str(cause) if isinstance(cause, ProviderError) else "it was interrupted"
        raise CleanupUnconfirmed(
            f"Creating the sandbox failed ({reason}) and it may have been created anyway; "
            f"checking for it failed too. Look for a sandbox named {token} in CreateOS."
        ) from cause
    return found


async def _delete_after_failure(
    client: CreateOSClient, sandbox_id: str, call: BoundCall, cause: BaseException
) -> None:
    deleted = False
    with anyio.CancelScope(shield=True), anyio.move_on_after(_cleanup_timeout(call)):
        try:
            await delete_sandbox_confirmed(client, sandbox_id)
            deleted = True
        except ProviderError:
            pass
    if not deleted:
        reason = str(cause) if isinstance(cause, ProviderError) else "it was interrupted"
        raise CleanupUnconfirmed(
            f"Setting up sandbox {sandbox_id} failed ({reason}) and deleting it failed too: the "
            f"sandbox may be left behind. Delete {sandbox_id} in CreateOS."
        ) from cause


def _cleanup_timeout(call: BoundCall) -> float:
    return min(call.timeout, CLEANUP_DEADLINE_CAP)


# -- resume --------------------------------------------------------------------------------


async def resume(runtime: DriverRuntime, params: LeaseIdParams) -> dict[str, Any]:
    call = bind_call(runtime, params)
    metadata = params.leaseMetadata or {}
    scope = await claim_lease(runtime, call, params.providerLeaseId, metadata)
    runtime.tracker.check_usable(scope, "resume this lease")
    sandbox_id = scope.lease_id
    marker = metadata.get("marker")
    if not isinstance(marker, str) or not MARKER_RE.fullmatch(marker):
        return GONE
    if _placement_changed(call, metadata):
        return GONE
    async with runtime.client_factory(call.config, call.api_key) as client:
        with deadline(min(call.timeout, RESUME_DEADLINE_CAP), "Resuming the CreateOS sandbox"):
            try:
                if await read_status(client, sandbox_id) in ("destroyed", "failed"):
                    return GONE
                await transition(client, sandbox_id, "running")
                check = await client.exec(sandbox_id, "/bin/cat", [MARKER_PATH])
            except NotFound:
                return GONE
    if check.exit_code != 0 or check.stdout != marker:
        return GONE
    return {
        "providerLeaseId": sandbox_id,
        "metadata": {**metadata, "resumedLease": True},
        "expiresAt": None,
    }


def _placement_changed(call: BoundCall, metadata: Mapping[str, Any]) -> bool:
    config = call.config
    return (
        metadata.get("shape") != config.shape
        or metadata.get("rootfs") != config.rootfs
        or metadata.get("region") != config.region
    )


# -- release / destroy ---------------------------------------------------------------------


async def release(
    runtime: DriverRuntime,
    params: LeaseIdParams,
    *,
    destroy: bool,
    on_kept: LeaseHook | None = None,
    before_teardown: TeardownHook | None = None,
) -> dict[str, Any] | None:
    if not params.providerLeaseId:
        return None
    call = bind_call(runtime, params)
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
            await runtime.clear_poison(scope)
            return {"providerLeaseId": sandbox_id, "state": "destroyed"}
        if runtime.tracker.is_unconfirmed(scope):
            raise RequestRefused(
                "This lease cannot be kept for reuse: a command on it may still be running "
                "because its cleanup could not be confirmed. Destroy the lease instead."
            )
        try:
            with deadline(call.timeout, "Pausing the CreateOS sandbox"):
                await transition(client, sandbox_id, "paused")
        except NotFound:
            return {"providerLeaseId": sandbox_id, "state": "destroyed"}
    if on_kept is not None:
        on_kept(call, sandbox_id)
    return {"providerLeaseId": sandbox_id, "state": "stopped"}


# -- realize -------------------------------------------------------------------------------


async def realize(runtime: DriverRuntime, params: LeaseParams) -> dict[str, Any]:
    call = bind_call(runtime, params)
    owned_scope(call, params.lease.providerLeaseId, params.lease.metadata)
    return {"cwd": ROOT, "metadata": {"provider": PROVIDER_NAME, "remoteCwd": ROOT}}
