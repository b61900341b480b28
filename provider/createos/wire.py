"""Whether a request could have had an effect, for callers that must know (a create whose
outcome decides between "nothing happened" and "look for it, maybe poison the lease").

The request core (:mod:`provider.createos.core`) keeps a :class:`Wire` up to date for each
attempt: ``queued`` while the request waits for its turn at the origin's pacer or for a retry,
``sent`` once the pacer has granted the slot, cleared again when the server refused that attempt
(a 429 or another ``rejected`` status: nothing was done) or the connection could not be made. So
a deadline that fires in the queue leaves ``sent`` False and ``queued`` True: nothing reached the
server. A ``Wire`` with ``settle`` lets an attempt that is on the wire finish (up to ``settle``
seconds) past a cancellation, so a create cut by its caller's deadline is answered, and can be
cleaned up, instead of leaving its outcome unknown; the cancellation is delivered at the caller's
next checkpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio
import anyio.lowlevel

from provider.createos.errors import APITimeout

T = TypeVar("T")


@dataclass
class Wire:
    """Where one request stands (module docstring): ``sent`` while an attempt may have reached
    the server with its outcome unknown, ``queued`` while it waits for its turn at the pacer or
    for a retry; ``settle``: seconds a sent attempt may run on past a cancellation."""

    sent: bool = False
    queued: bool = False
    settle: float = 0.0


async def settled(send: Callable[[], Awaitable[T]], wire: Wire, operation: str) -> T:
    """``send()``; with ``wire.settle``, shielded from cancellation for up to that long (the
    cancellation held back is delivered at the caller's next checkpoint). A send the settle
    time cuts short raises :class:`APITimeout` unless a cancellation is pending."""
    if wire.settle <= 0:
        return await send()
    with anyio.CancelScope(shield=True, deadline=anyio.current_time() + wire.settle):
        return await send()
    await anyio.lowlevel.checkpoint()  # a cancellation held back by the shield wins
    raise APITimeout(operation, f"CreateOS {operation} failed: no answer within {wire.settle:g} s.")
