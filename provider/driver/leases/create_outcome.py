"""Creating or forking a sandbox whose outcome may be unknown (docs/protocol.md 2.3.3, 8.4).

A create or fork has no idempotency key. When it fails other than definitely (a 5xx but 503, a
transport failure, a malformed answer, the deadline or a cancellation mid-call), it may have made
a billable sandbox anyway: :func:`create_sandbox` and :func:`fork_sandbox` then list the
sandboxes, delete every one that carries the request's token (a create's name, a fork's env key)
and let the failure propagate. :func:`delete_after_failure` deletes a sandbox whose setup failed.
Every such cleanup runs under a fresh, shielded deadline bounded by the host's budget, and one
that cannot be confirmed raises :class:`~provider.errors.CleanupUnconfirmed` naming what to
delete by hand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from provider.createos.client import CreateOSClient
from provider.createos.errors import APIStatusError, InvalidIdentifier
from provider.createos.models import SandboxView
from provider.createos.wire import Wire
from provider.driver.commands.sandbox_ops import delete_sandbox_confirmed
from provider.driver.core.runtime import BoundCall
from provider.driver.leases.forks import ForkRefused, carries_token, fork_template
from provider.driver.leases.placement import Placement
from provider.errors import CleanupUnconfirmed, ProviderError

CLEANUP_DEADLINE_CAP = 60.0


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


async def delete_after_failure(
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
