"""Cleaning up after a crashed worker, from what the journal recorded.

``recover_orphans`` runs at the start of every call that carries an environment config. For the
call's API origin and key it finds journal entries whose owner process is gone: managed processes
that may still run (their tree is killed; if that cannot be confirmed the lease is poisoned),
sandbox creates and forks that never finished or whose outcome stayed open (the sandbox carrying
the token, as its name or as a fork's env key, is deleted; one not found yet is looked for again
while the journal watches it), host temp folders of interrupted transfers (removed), and their
sandbox scratch files (removed with one ``exec`` each; the row is kept for a later call only
when CreateOS could not be reached, so a sandbox since deleted does not cost a request forever).
Leases whose deadline (``requestedExpiresAt``) has passed are deleted first
(:func:`provider.driver.leases.expiry.delete_expired`). Nothing happens, and no HTTP request is
made, when the journal holds no orphan for that origin
and key.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.errors import APIConnectionError
from provider.driver.commands.sandbox_ops import (
    delete_sandbox_confirmed,
    kill_tree,
    scratch_removal,
)
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.runtime import BoundCall, DriverRuntime, owned_scope
from provider.driver.core.tracker import ScopeKey
from provider.driver.leases.expiry import delete_expired
from provider.errors import ProviderError

RECOVERY_BUDGET = 30.0


async def recover_orphans(runtime: DriverRuntime, call: BoundCall) -> None:
    journal = runtime.journal
    key_hash = call.scope("").key_hash
    processes = await anyio.to_thread.run_sync(
        journal.orphan_processes, call.config.api_url, key_hash
    )
    creates = await anyio.to_thread.run_sync(journal.orphan_creates, call.config.api_url, key_hash)
    scratches = await anyio.to_thread.run_sync(
        journal.orphan_scratches, call.config.api_url, key_hash
    )
    await delete_expired(runtime, call)  # leases past their deadline (a worker down then)
    tempdirs = await anyio.to_thread.run_sync(journal.orphan_tempdirs)
    for path in tempdirs:
        await anyio.to_thread.run_sync(_remove_tempdir, journal, path)
    if not processes and not creates and not scratches:
        return
    async with runtime.client_factory(call.config, call.api_key) as client:
        with anyio.move_on_after(RECOVERY_BUDGET):
            for orphan in processes:
                killed = await kill_tree(client, orphan.scope.lease_id, orphan.process_id)
                if killed:
                    await anyio.to_thread.run_sync(journal.remove_process, orphan.process_id)
                else:
                    runtime.tracker.mark_unconfirmed(orphan.scope)
                    await anyio.to_thread.run_sync(journal.mark_unconfirmed, orphan.scope)
            if creates:
                await _reap_creates(client, journal, set(creates))
            for sandbox_id, scratch in scratches:
                await _remove_scratch(client, journal, sandbox_id, scratch)


async def claim_lease(
    runtime: DriverRuntime,
    call: BoundCall,
    lease_id: str | None,
    metadata: Mapping[str, Any] | None,
) -> ScopeKey:
    """Ownership check (no HTTP on refusal), then crash recovery and any journaled poison mark:
    what every call on an existing lease does before its own work."""
    scope = owned_scope(call, lease_id, metadata)
    await recover_orphans(runtime, call)
    await runtime.load_poison(scope)
    return scope


async def _reap_creates(client: CreateOSClient, journal: LeaseJournal, tokens: set[str]) -> None:
    try:
        views = await client.list_sandboxes()
        for view in views:
            # A create's token is its name; a fork's is one of its env keys (forks take no name).
            hits = (tokens & {view.name}) or (tokens & view.env_keys)
            if hits:
                await delete_sandbox_confirmed(client, view.id)
                for token in hits:
                    tokens.discard(token)
                    await anyio.to_thread.run_sync(journal.remove_create, token)
    except ProviderError:
        return  # try again on the next call
    for token in tokens:  # not found: done, unless a late create may still land
        if not await anyio.to_thread.run_sync(journal.watching_create, token):
            await anyio.to_thread.run_sync(journal.remove_create, token)


async def _remove_scratch(
    client: CreateOSClient, journal: LeaseJournal, sandbox_id: str, path: str
) -> None:
    """``rm -f`` the scratch and its parts; any answer from CreateOS (removed, or the sandbox
    gone or not running) settles the row, a connection error keeps it for the next call."""
    command, args = scratch_removal(path, parts=True)
    try:
        await client.exec(sandbox_id, command, args)
    except APIConnectionError:
        return
    except ProviderError:
        pass
    await anyio.to_thread.run_sync(journal.remove_scratch, path)


def _remove_tempdir(journal: LeaseJournal, path: Path) -> None:
    if path.name.startswith(".paperclip-createos-"):
        shutil.rmtree(path, ignore_errors=True)
    journal.remove_tempdir(path)
