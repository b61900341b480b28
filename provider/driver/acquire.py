"""Acquire (provider-behavior.md 2.3): create a sandbox and prove it is ours.

Acquire plans the sandbox (:mod:`provider.driver.placement`: egress, warm window, rootfs per
adapter, snapshot), creates it with a unique name token (``pc-<scope tag>-<uuid>``) or, when the
environment is bound to a snapshot template, forks that (8.4, :mod:`provider.driver.forks`),
waits for ``running``, prepares the workspace and writes a random marker that resume reads
back. Every refusal happens before the first HTTP request. Whatever fails after the create or
fork deletes the sandbox again; a create or fork whose outcome is unknown is looked up by its
token (name or fork token) and deleted. Setup sessions (:mod:`provider.driver.templates`)
provision the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.errors import APIStatusError, InvalidIdentifier
from provider.createos.models import SandboxView
from provider.createos.wire import Wire
from provider.driver.create_watch import watch_creates
from provider.driver.forks import ForkRefused, carries_token, fork_template, fork_token
from provider.driver.journal import LeaseJournal
from provider.driver.params import AcquireParams
from provider.driver.placement import Placement, plan_placement
from provider.driver.recovery import recover_orphans
from provider.driver.reuse import name_token
from provider.driver.running import when_running
from provider.driver.runtime import (
    PROVIDER_NAME,
    ROOT,
    BoundCall,
    DriverRuntime,
    bind_call,
    deadline,
)
from provider.driver.sandbox_ops import delete_sandbox_confirmed
from provider.errors import CleanupUnconfirmed, ProviderError, RequestRefused

MARKER_DIR = f"{ROOT}/.paperclip-runtime"
MARKER_PATH = f"{MARKER_DIR}/.paperclip-createos-lease"
CLEANUP_DEADLINE_CAP = 60.0

LeaseHook = Callable[[BoundCall, str], None]
"""Told the call and the lease id of a reusable or kept lease; returns at once."""


async def acquire(
    runtime: DriverRuntime, params: AcquireParams, *, on_reusable: LeaseHook | None = None
) -> dict[str, Any]:
    if params.requestedExpiresAt:
        raise RequestRefused(
            "CreateOS cannot bound a lease's lifetime (it has no hard expiry), so a lease with "
            "requestedExpiresAt cannot be honoured."
        )
    call = bind_call(runtime, params)
    placement = plan_placement(
        call.config,
        adapter_type=params.adapterType,
        workspace_settings=params.executionWorkspaceSettings,
        execution_workspace_id=params.executionWorkspaceId,
        agent_id=params.agentId,
    )
    await recover_orphans(runtime, call)
    create = Wire()
    try:
        async with runtime.client_factory(call.config, call.api_key) as client:
            with deadline(call.timeout, "Acquiring a CreateOS sandbox", wire=create):
                sandbox_id, marker = await provision_sandbox(
                    client, call, runtime.journal, placement, wire=create
                )
    except BaseException:
        if create.sent:  # its outcome may be open: look for it without waiting for a call
            watch_creates(runtime, call)
        raise
    if placement.reusable and placement.snapshot is not None:  # a fork: no name to find it by
        await anyio.to_thread.run_sync(
            runtime.journal.add_kept_fork, call.scope_tag, call.scope("").key_hash, sandbox_id
        )
    if placement.reusable and on_reusable is not None:
        on_reusable(call, sandbox_id)
    return {
        "providerLeaseId": sandbox_id,
        "metadata": lease_metadata(call, marker, placement),
        "expiresAt": None,
    }


def lease_metadata(call: BoundCall, marker: str, placement: Placement) -> dict[str, Any]:
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
        "region": config.region,
        **placement.metadata(),
    }


def disposable_placement(call: BoundCall) -> Placement:
    """A lease no run will reuse (probe): the base egress list, no window, no adapter."""
    return plan_placement(
        call.config,
        adapter_type=None,
        workspace_settings=None,
        execution_workspace_id=None,
        agent_id=None,
    )


async def provision_sandbox(
    client: CreateOSClient,
    call: BoundCall,
    journal: LeaseJournal,
    placement: Placement,
    *,
    name: str | None = None,
    wire: Wire | None = None,
) -> tuple[str, str]:
    """Create (or fork) a sandbox, bring it to ``running`` and prepare the workspace and marker;
    returns its id and the marker. ``name``: the create's name token (default
    ``pc-<scope tag>-<uuid>``); a fork takes none and carries a fork token instead
    (:func:`provider.driver.forks.fork_token`). ``wire`` follows the create's request: one
    that never left the rate-limit queue created nothing, so nothing is looked for.

    Runs under the caller's deadline. Whatever fails after the create deletes the sandbox again
    (under a fresh, shielded deadline) before the error propagates. The token (name or fork
    token) is journaled until the outcome is settled, so a worker crash in between cannot leak
    it. When the outcome stays open (a create or fork that may still land after its lookup
    found nothing, or a cleanup that failed), the token is handed to recovery, which keeps
    looking for the sandbox on later calls with this origin and key
    (:meth:`LeaseJournal.abandon_create`).
    """
    snapshot = placement.snapshot
    token = fork_token() if snapshot is not None else name or name_token(call.scope_tag)
    key_hash = call.scope("").key_hash
    await anyio.to_thread.run_sync(journal.add_create, call.config.api_url, key_hash, token)
    unresolved = False

    def mark_unresolved() -> None:
        nonlocal unresolved
        unresolved = True

    try:
        if snapshot is not None:
            sandbox_id, status = await fork_sandbox(
                client, call, placement, snapshot, token, on_unresolved=mark_unresolved
            )
            patch = placement.window_patch()
        else:
            sandbox_id, status = await create_sandbox(
                client, call, placement, token, on_unresolved=mark_unresolved, wire=wire
            )
            patch = None
        marker = await prepare_sandbox(client, call, sandbox_id, status=status, patch=patch)
        return sandbox_id, marker
    except CleanupUnconfirmed:
        unresolved = True
        raise
    finally:
        with anyio.CancelScope(shield=True):
            settle = journal.abandon_create if unresolved else journal.remove_create
            await anyio.to_thread.run_sync(settle, token)


async def prepare_sandbox(
    client: CreateOSClient,
    call: BoundCall,
    sandbox_id: str,
    *,
    status: str | None,
    patch: dict[str, Any] | None = None,
) -> str:
    """The guarded block of 2.3.4 on a sandbox just created or forked (``status``: what that
    answered): wait for ``running``, apply ``patch`` (``patch_sandbox`` keywords; a fork's
    window), prepare the workspace and write a fresh marker, which is returned. Any failure
    deletes the sandbox before the error propagates."""
    try:
        if patch:  # a fork, patched once a read shows it running (it answers forking)
            await when_running(
                client,
                sandbox_id,
                status or "running",
                lambda: client.patch_sandbox(sandbox_id, **patch),
            )
            status = "running"
        # One request prepares the workspace and writes the marker (36 bytes, no newline): the
        # marker is a fresh UUID (hex and dashes only), so it needs no quoting. A create that
        # answered running, or no status at all (the TS SDK's body: it answers once booted),
        # gets no read first: the exec is the read, and its 409 (nothing ran) makes us poll.
        marker = str(uuid.uuid4())
        script = f"mkdir -p -- '{MARKER_DIR}' && printf '%s' '{marker}' > '{MARKER_PATH}'"
        prepared = await when_running(
            client,
            sandbox_id,
            status or "running",
            lambda: client.exec(sandbox_id, "/bin/bash", ["-lc", script]),
        )
        if prepared.exit_code != 0:
            raise ProviderError(
                f"Could not prepare {ROOT} in the sandbox (exit code {prepared.exit_code}); the "
                "image must provide bash and coreutils."
            )
    except BaseException as exc:
        await _delete_after_failure(client, sandbox_id, call, exc)
        raise
    return marker


async def create_sandbox(
    client: CreateOSClient,
    call: BoundCall,
    placement: Placement,
    token: str,
    *,
    on_unresolved: Callable[[], None] | None = None,
    wire: Wire | None = None,
) -> tuple[str, str | None]:
    """POST the sandbox (its id and the status it answered); when the outcome is unknown (its
    request was sent: ``wire``), find it by its name token and delete it.

    ``on_unresolved`` is called when the lookup found nothing: the create may still land later
    (a request that timed out on our side can still be served), so absence proves nothing yet.
    """
    config = call.config
    wire = wire if wire is not None else Wire()
    async with _found_if_unknown(
        client,
        call,
        definite=lambda exc: _rejected(exc) or not wire.sent,
        matches=lambda view: view.name == token,
        what="Creating the sandbox",
        look_for=f"a sandbox named {token}",
        on_unresolved=on_unresolved,
    ):
        return await client.create_sandbox_status(
            shape=config.shape,
            name=token,
            rootfs=placement.rootfs,
            region=config.region,
            wire=wire,
            **placement.create_fields(),
        )


async def fork_sandbox(
    client: CreateOSClient,
    call: BoundCall,
    placement: Placement,
    source_id: str,
    token: str,
    *,
    on_unresolved: Callable[[], None] | None = None,
) -> tuple[str, str | None]:
    """Fork the template ``source_id`` carrying ``token`` (its id and answered status); when
    the outcome is unknown, find the fork by its token and delete it (``on_unresolved`` as
    for :func:`create_sandbox`)."""
    async with _found_if_unknown(
        client,
        call,
        definite=lambda exc: _rejected(exc) or isinstance(exc, ForkRefused | InvalidIdentifier),
        matches=lambda view: carries_token(view, token, source_id),
        what=f"Forking template {source_id}",
        look_for=f"a sandbox forked from {source_id} with the env key {token}",
        on_unresolved=on_unresolved,
    ):
        return await fork_template(client, source_id, placement, token)


def _rejected(exc: BaseException) -> bool:
    return isinstance(exc, APIStatusError) and exc.rejected


@asynccontextmanager
async def _found_if_unknown(
    client: CreateOSClient,
    call: BoundCall,
    *,
    definite: Callable[[BaseException], bool],
    matches: Callable[[SandboxView], bool],
    what: str,
    look_for: str,
    on_unresolved: Callable[[], None] | None,
) -> AsyncIterator[None]:
    """Around a create or fork: when it fails other than ``definite``ly (a 5xx but 503, a transport
    failure, a malformed answer, the deadline or a cancellation mid-call), its outcome is
    unknown, so delete every sandbox that ``matches`` (it carries the request's token), then
    let the failure propagate. ``on_unresolved`` is called when none was found; a lookup or
    delete that fails raises :class:`CleanupUnconfirmed`."""
    try:
        yield
    except BaseException as cause:
        if definite(cause):
            raise  # a definite answer: nothing was made
        found = False

        async def reap() -> None:
            nonlocal found
            for view in await client.list_sandboxes():
                if matches(view):
                    found = True
                    await delete_sandbox_confirmed(client, view.id)

        if not await _cleaned_up(call, reap):
            raise CleanupUnconfirmed(
                f"{what} failed ({_reason(cause)}), but the sandbox may exist anyway; checking "
                f"for it failed too. Look for {look_for} in CreateOS and delete it."
            ) from cause
        if not found and on_unresolved is not None:
            on_unresolved()
        raise


async def _delete_after_failure(
    client: CreateOSClient, sandbox_id: str, call: BoundCall, cause: BaseException
) -> None:
    if not await _cleaned_up(call, lambda: delete_sandbox_confirmed(client, sandbox_id)):
        raise CleanupUnconfirmed(
            f"Setting up sandbox {sandbox_id} failed ({_reason(cause)}) and deleting it failed "
            f"too: the sandbox may be left behind. Delete {sandbox_id} in CreateOS."
        ) from cause


async def _cleaned_up(call: BoundCall, cleanup: Callable[[], Awaitable[None]]) -> bool:
    """Run ``cleanup`` under a fresh, shielded, bounded scope (it must run even after a
    cancel, and end within the host's budget); whether it finished without a provider error."""
    with call.cleanup_bound(_cleanup_timeout(call)).scope():
        try:
            await cleanup()
            return True
        except ProviderError:
            pass
    return False


def _reason(cause: BaseException) -> str:
    return str(cause) if isinstance(cause, ProviderError) else "it was interrupted"


def _cleanup_timeout(call: BoundCall) -> float:
    return min(call.timeout, CLEANUP_DEADLINE_CAP)
