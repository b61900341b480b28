"""Leases with a deadline (``requestedExpiresAt``, the host's setup-token login leases).

CreateOS has no server-side lifetime, so a deadline is kept by two independent lines:

1. **The guard** (:mod:`provider.driver.commands.expiry_guard`), started inside the sandbox by
   the exec that prepares it, which asks the in-guest agent to delete the sandbox at the
   deadline. It needs neither the worker nor the host.
2. **The worker's line**: while the worker lives, a background job deletes the sandbox at the
   deadline (confirmed); a journal row (sandbox, origin, key hash, deadline) outlives the worker,
   and :func:`delete_expired` (run by recovery at the start of every call with that origin and
   key, before the call's own work) deletes leases whose deadline has passed and draws the line
   for those still ahead (a worker restarted before the deadline). At worker start,
   :func:`delete_expired_at_start` does the same for the one origin and key the worker knows
   without a call (the official endpoint and its own ``CREATEOS_API_KEY``).

Such leases are never reusable and never kept (release deletes), so the reaper never sees them
paused. The lease answers ``expiresAt`` = the deadline (never later). A deadline in the past, or
less than :data:`MIN_LEAD_SECONDS` ahead, is refused before any request.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import anyio

from provider.config import parse_config, resolve_api_key
from provider.driver.commands.sandbox_ops import delete_sandbox_confirmed
from provider.driver.core import gone
from provider.driver.core.runtime import BoundCall, DriverRuntime
from provider.errors import ConfigError, ProviderError, RequestRefused

MIN_LEAD_SECONDS = 15.0
"""The shortest lead a deadline may have: a create, its boot to ``running`` and the exec that
starts and confirms the guard take a few seconds on CreateOS (about 2 s on the emulator); 15 s
leaves the lease some use before it is deleted rather than answering one already expiring."""
START_SHAPE = "s-1vcpu-1gb"
DELETE_BUDGET = 60.0
"""The worker line's bound for one confirmed delete."""


def parse_deadline(value: object, *, now: float | None = None) -> float | None:
    """``requestedExpiresAt`` (an ISO 8601 string, as the host sends it, or epoch milliseconds)
    as epoch seconds; None when absent. Refuses (:class:`RequestRefused`) a malformed value and
    a deadline less than :data:`MIN_LEAD_SECONDS` ahead."""
    if value is None or value == "":
        return None
    deadline: float | None = None
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            moment = None
        if moment is not None:
            deadline = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        deadline = float(value) / 1000
    if deadline is None:
        raise RequestRefused(
            f"requestedExpiresAt must be an ISO 8601 time (e.g. 2026-01-31T12:00:00.000Z) or "
            f"epoch milliseconds; got {str(value)[:64]!r}."
        )
    lead = deadline - (time.time() if now is None else now)
    if lead < MIN_LEAD_SECONDS:
        when = "is in the past" if lead <= 0 else f"is only {lead:.1f} s ahead"
        raise RequestRefused(
            f"requestedExpiresAt {iso(deadline)} {when}: a lease with a deadline needs at least "
            f"{MIN_LEAD_SECONDS:g} s to create the sandbox and start its expiry guard. Nothing "
            "was created; ask again with a later deadline."
        )
    return deadline


def iso(epoch: float) -> str:
    """Epoch seconds as the ISO 8601 UTC text the host parses (milliseconds, ``Z``)."""
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


async def remember(
    runtime: DriverRuntime, call: BoundCall, sandbox_id: str, deadline: float
) -> None:
    """Journal the lease and start the worker's line (module docstring, 2)."""
    await anyio.to_thread.run_sync(
        runtime.journal.add_expiring,
        call.config.api_url,
        call.scope("").key_hash,
        sandbox_id,
        deadline,
    )
    _draw_line(runtime, call, sandbox_id, deadline)


def _draw_line(runtime: DriverRuntime, call: BoundCall, sandbox_id: str, deadline: float) -> None:
    """A background job that deletes the lease at ``deadline`` unless it was released first;
    one per lease and worker."""
    if sandbox_id in runtime.expiry_lines:
        return
    journal = runtime.journal

    async def at_deadline() -> None:
        try:
            await anyio.sleep(max(0.0, deadline - time.time()))
            if await anyio.to_thread.run_sync(journal.is_expiring, sandbox_id):
                await delete_expired_lease(runtime, call, sandbox_id)
        finally:
            runtime.expiry_lines.discard(sandbox_id)

    if runtime.background.start_soon(at_deadline):
        runtime.expiry_lines.add(sandbox_id)


async def forget(runtime: DriverRuntime, sandbox_id: str) -> None:
    """The lease was deleted (released, destroyed): its row goes."""
    await anyio.to_thread.run_sync(runtime.journal.remove_expiring, sandbox_id)


async def delete_expired_lease(runtime: DriverRuntime, call: BoundCall, sandbox_id: str) -> None:
    """Delete an expired lease's sandbox (confirmed) and drop its row; a failure keeps the row
    for the next call with this origin and key."""
    try:
        async with runtime.client_factory(call.config, call.api_key) as client:
            with anyio.move_on_after(DELETE_BUDGET) as scope:
                await delete_sandbox_confirmed(client, sandbox_id)
            if scope.cancelled_caught:
                return
    except ProviderError:
        return
    await runtime.gone.mark(call.scope(sandbox_id), gone.EXPIRED)
    await forget(runtime, sandbox_id)


async def delete_expired(runtime: DriverRuntime, call: BoundCall) -> None:
    """Delete every lease of this call's origin and key whose deadline has passed (a worker
    that was not running at the deadline), and draw the worker's line for the others (a worker
    restarted before it); no request when none has passed."""
    rows = await anyio.to_thread.run_sync(
        runtime.journal.expiring, call.config.api_url, call.scope("").key_hash
    )
    now = time.time()
    for sandbox_id, deadline in rows:
        if deadline <= now:
            await delete_expired_lease(runtime, call, sandbox_id)
        else:
            _draw_line(runtime, call, sandbox_id, deadline)


async def delete_expired_at_start(runtime: DriverRuntime) -> None:
    """At worker start, for the one origin and key the worker knows without a call: the
    official endpoint with the worker's own ``CREATEOS_API_KEY``. Leases of any other origin or
    key wait for :func:`delete_expired` at a call that brings their config. Without that key
    (:func:`resolve_api_key` refuses) it does nothing."""
    try:
        config = parse_config({"shape": START_SHAPE})  # the shape is never used here
        api_key = resolve_api_key(config, runtime.environ)
    except ConfigError:
        return
    await delete_expired(runtime, BoundCall(config, api_key, "", ""))
