"""How long cleanup may run: never past the host's budget for the call.

The host gives each call a budget and discards an answer that comes later (it fails the call
locally and sends no cancel): ``environmentExecute`` gets the command's ``timeoutMs`` (else the
config's) plus 30 s; acquire, release, destroy and sync get ``max(config.timeoutMs,
config.bridgeRequestTimeoutMs)`` plus 30 s. Work that ends early (a command's deadline, a failed
sync) still has to clean up (kill the process tree, remove staged files) before it answers. A
:class:`CleanupBound` gives all of that cleanup one deadline: ``cap`` seconds from when it
starts, but never past the host's budget less :data:`ANSWER_MARGIN` (time to journal a poison
mark and write the answer). Cleanup cut short by it is unconfirmed: the lease is poisoned and the
call answers that specific error while the host still listens.

The budget is counted from when the worker received the call (a little after the host started
its timer: the margin covers that) and from ``config.timeoutMs`` alone for the verbs whose host
budget is a maximum, which can only make it shorter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import anyio

from provider.errors import RateLimitQueued

HOST_GRACE: Final = 30.0
"""Seconds the host adds to a call's timeout before it gives up on the answer."""
ANSWER_MARGIN: Final = 2.0
"""Seconds kept free at the end of the host's budget to journal and send the answer."""


@dataclass(frozen=True)
class CleanupBound:
    """Cleanup gets ``cap`` seconds from its start, and never runs past ``ends_at`` (anyio
    time; infinite when the call has no host budget to respect)."""

    cap: float
    ends_at: float = math.inf

    def scope(self) -> anyio.CancelScope:
        """A fresh, shielded scope for one cleanup that starts now (every step of that cleanup
        runs inside it, so they share the bound instead of getting ``cap`` each)."""
        deadline = min(anyio.current_time() + self.cap, self.ends_at)
        return anyio.CancelScope(deadline=deadline, shield=True)


def host_bound(cap: float, host_timeout: float, *, since: float) -> CleanupBound:
    """The bound of a call received at ``since`` (anyio time) whose host timeout is
    ``host_timeout`` seconds (the host waits that plus :data:`HOST_GRACE`)."""
    return CleanupBound(cap, since + host_timeout + HOST_GRACE - ANSWER_MARGIN)


def as_bound(cleanup: CleanupBound | float) -> CleanupBound:
    """``cleanup`` as a bound (a number is a cap without a host budget)."""
    return cleanup if isinstance(cleanup, CleanupBound) else CleanupBound(cleanup)


def not_started(timeout: float) -> RateLimitQueued:
    """The error of a command whose ``timeout`` (seconds) passed while its request still waited
    for its turn in the rate-limit queue: nothing was sent, nothing ran."""
    return RateLimitQueued(
        f"The command did not start within its {timeout:g} s timeout: its request was still "
        "waiting for its turn in the CreateOS rate-limit queue (the API allows 300 requests a "
        "minute per address), so nothing was sent and nothing ran. Run it again, with a longer "
        "timeoutMs or fewer commands at once."
    )
