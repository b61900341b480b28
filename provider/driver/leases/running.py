"""State changes of a lease's sandbox in the fewest requests (docs/protocol.md 2.2, 2.4, 2.5).

:func:`provider.driver.commands.sandbox_ops.transition` reads before it submits and reads again
until the state shows. Resume and release often know more than that, and every request they save
comes out of the 300 a minute every agent of the host shares:

- :func:`when_running` runs a step that needs ``running`` (resume's marker read) starting from
  the status a read just answered: a ``running`` sandbox gets the step at once, a ``paused`` one
  (or ``error``) one resume, and after it the step itself is the read that shows ``running``.
  A step refused with 409 ran nothing (the sandbox was not running after all: an idle pause
  came in between, or the resume has not landed yet), so the status is read and the step is
  tried again once it reads ``running``.
- :func:`pause_until_paused` submits the pause without reading first (its 409 says the sandbox
  is not running, and then :func:`transition` decides from reads), then reads until ``paused``.

Both submit at most once, poll every :data:`POLL_INTERVAL` through transitional states, fail on
a state from which the wanted one cannot be reached, and run under the caller's deadline.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.errors import Conflict
from provider.createos.models import SANDBOX_STATES, SandboxView
from provider.driver.commands.sandbox_ops import (
    POLL_INTERVAL,
    TRANSITIONAL,
    SandboxStateError,
    read_status,
    transition,
)

T = TypeVar("T")

RESUMABLE = frozenset({"paused", "error"})


async def read_view(client: CreateOSClient, sandbox_id: str) -> SandboxView:
    """``GET`` the sandbox; a state string CreateOS does not document fails."""
    view = await client.get_sandbox(sandbox_id)
    if view.status not in SANDBOX_STATES:
        raise SandboxStateError(
            f"CreateOS reported an unknown state for sandbox {sandbox_id}.", status=view.status
        )
    return view


async def when_running(
    client: CreateOSClient, sandbox_id: str, status: str, step: Callable[[], Awaitable[T]]
) -> T:
    """Bring the sandbox from ``status`` (what a read just answered) to ``running`` and run
    ``step``, which needs it; returns what the step returns. A 409 from the step right after a
    read that said ``running`` is the step's own failure and propagates."""
    submitted = False
    fresh = False  # status comes from a read made just now, with nothing in between
    while True:
        if status == "running":
            try:
                return await step()
            except Conflict:
                if fresh:
                    raise
        elif status in RESUMABLE and not submitted:
            try:
                await client.resume_sandbox(sandbox_id)
            except Conflict:
                pass  # the next read decides
            else:
                submitted = True
                await anyio.sleep(POLL_INTERVAL)
                status, fresh = "running", False  # the step is the read that shows it
                continue
        elif status not in TRANSITIONAL and status not in RESUMABLE:
            raise SandboxStateError(
                f"Sandbox {sandbox_id} is {status} and cannot become running.", status=status
            )
        await anyio.sleep(POLL_INTERVAL)
        status, fresh = await read_status(client, sandbox_id), True


async def pause_until_paused(client: CreateOSClient, sandbox_id: str) -> None:
    """Pause the sandbox and return once it reads ``paused``."""
    try:
        await client.pause_sandbox(sandbox_id)
    except Conflict:  # not running (pausing, paused, or a state it cannot leave)
        await transition(client, sandbox_id, "paused")
        return
    while True:
        await anyio.sleep(POLL_INTERVAL)
        status = await read_status(client, sandbox_id)
        if status == "paused":
            return
        if status not in ("running", "pausing"):  # running: a read before the pause shows
            raise SandboxStateError(
                f"Sandbox {sandbox_id} is {status} and cannot become paused.", status=status
            )
