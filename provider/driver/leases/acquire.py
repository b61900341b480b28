"""Acquire (docs/protocol.md 2.3): create a sandbox and prove it is ours.

Acquire plans the sandbox (:mod:`provider.driver.leases.placement`: egress, warm window, rootfs per
adapter, snapshot), creates it with a unique name token (``pc-<scope tag>-<uuid>``) or, when the
environment is bound to a snapshot template, forks that (8.4, :mod:`provider.driver.leases.forks`),
waits for ``running``, prepares the workspace and writes a random marker that resume reads
back. Every refusal happens before the first HTTP request. Whatever fails after the create or
fork deletes the sandbox again; a create or fork whose outcome is unknown is looked up by its
token (name or fork token) and deleted (:mod:`provider.driver.leases.create_outcome`). Setup
sessions (:mod:`provider.driver.setup.templates`) provision the same way.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.wire import Wire
from provider.driver.commands.expiry_guard import (
    AGENT_UNREACHABLE,
    GUARD_NOT_RUNNING,
    start_and_confirm,
)
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.names import name_token
from provider.driver.core.ownership import PROVIDER_NAME
from provider.driver.core.params import AcquireParams
from provider.driver.core.runtime import (
    ROOT,
    BoundCall,
    DriverRuntime,
    bind_call,
    deadline,
)
from provider.driver.leases.answers import LeaseAnswer
from provider.driver.leases.create_outcome import create_sandbox, delete_after_failure, fork_sandbox
from provider.driver.leases.create_watch import watch_creates
from provider.driver.leases.expiry import iso, parse_deadline, remember
from provider.driver.leases.forks import fork_token
from provider.driver.leases.placement import Placement, plan_placement
from provider.driver.leases.recovery import recover_orphans
from provider.driver.leases.running import when_running
from provider.errors import CleanupUnconfirmed, ProviderError

MARKER_DIR = f"{ROOT}/.paperclip-runtime"
MARKER_PATH = f"{MARKER_DIR}/.paperclip-createos-lease"

GUARD_FAILURES = {
    GUARD_NOT_RUNNING: "The lease's expiry guard did not start in sandbox {sandbox_id} (no "
    "running guard process after 5 s); the sandbox was deleted. The image must provide bash, "
    "setsid and coreutils.",
    AGENT_UNREACHABLE: "The lease's expiry guard cannot reach the sandbox's in-guest agent "
    "(127.0.0.1:1029 did not answer), so sandbox {sandbox_id} could not delete itself at the "
    "deadline; it was deleted. A lease with requestedExpiresAt needs the agent.",
}

LeaseHook = Callable[[BoundCall, str], None]
"""Told the call and the lease id of a reusable or kept lease; returns at once."""


async def acquire(
    runtime: DriverRuntime, params: AcquireParams, *, on_reusable: LeaseHook | None = None
) -> LeaseAnswer:
    expires = parse_deadline(params.requestedExpiresAt)  # refused before any request
    call = bind_call(runtime, params)
    placement = plan_placement(
        call.config,
        adapter_type=params.adapterType,
        workspace_settings=params.executionWorkspaceSettings,
        execution_workspace_id=params.executionWorkspaceId,
        agent_id=params.agentId if expires is None else None,  # never reusable, never kept
    )
    await recover_orphans(runtime, call)
    create = Wire()
    try:
        async with runtime.client_factory(call.config, call.api_key) as client:
            with deadline(call.timeout, "Acquiring a CreateOS sandbox", wire=create):
                sandbox_id, marker = await provision_sandbox(
                    client, call, runtime.journal, placement, wire=create, expires=expires
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
    metadata = lease_metadata(call, marker, placement)
    if expires is None:
        return LeaseAnswer(call, sandbox_id, metadata)
    with anyio.CancelScope(shield=True):  # the guard runs: the worker's line must be drawn too
        await remember(runtime, call, sandbox_id, expires)
    return LeaseAnswer(call, sandbox_id, {**metadata, "expiresAt": iso(expires)}, iso(expires))


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
    expires: float | None = None,
) -> tuple[str, str]:
    """Create (or fork) a sandbox, bring it to ``running`` and prepare the workspace and marker;
    returns its id and the marker. ``name``: the create's name token (default
    ``pc-<scope tag>-<uuid>``); a fork takes none and carries a fork token instead
    (:func:`provider.driver.leases.forks.fork_token`). ``wire`` follows the create's request: one
    that never left the rate-limit queue created nothing, so nothing is looked for. ``expires``
    (epoch seconds): the same exec that prepares the workspace starts and confirms the expiry
    guard (:mod:`provider.driver.commands.expiry_guard`).

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
        marker = await prepare_sandbox(
            client, call, sandbox_id, status=status, patch=patch, expires=expires
        )
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
    expires: float | None = None,
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
        if expires is not None:
            script = f"{{ {script}; }} || exit 1{start_and_confirm(math.ceil(expires))}"
        prepared = await when_running(
            client,
            sandbox_id,
            status or "running",
            lambda: client.exec(sandbox_id, "/bin/bash", ["-lc", script]),
        )
        if expires is not None and prepared.exit_code in GUARD_FAILURES:
            raise ProviderError(GUARD_FAILURES[prepared.exit_code].format(sandbox_id=sandbox_id))
        if prepared.exit_code != 0:
            raise ProviderError(
                f"Could not prepare {ROOT} in the sandbox (exit code {prepared.exit_code}); the "
                "image must provide bash and coreutils."
            )
    except BaseException as exc:
        await delete_after_failure(client, sandbox_id, call, exc)
        raise
    return marker
