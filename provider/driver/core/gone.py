"""Leases whose sandbox is gone: refused at once, with zero API requests.

A host may keep calling on a lease after its sandbox was deleted (the callback bridge of
``@paperclipai/adapter-utils`` retries its error writes every 5 s, forever, against released
leases). Each such call used to cost a paced request answered 404, and enough of them spend the
whole API budget of the address. :class:`GoneLeases` remembers the sandboxes this worker deleted
(a release without reuse, a destroy) and those CreateOS answered 404 for, by origin, key and
sandbox id: executes and syncs on them are refused with :class:`~provider.errors.LeaseGone`
before any request, and resume answers gone. A release or destroy sends nothing only for a
sandbox deleted here (:meth:`GoneLeases.deleted_here`): after a mere 404 it still deletes, which
costs one request and can never leave a sandbox billing. A reuse release (the sandbox kept,
paused or warm) is *not* gone: resume must work.

The memory is bounded (:data:`MEMORY_CAP` entries, the oldest dropped first) and expires after
:data:`TTL_SECONDS`; the journal's ``gone`` table (capped too) keeps the same facts across a
worker restart and is read when the memory does not know a lease.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final

import anyio

from provider.createos.errors import NotFound
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.tracker import ScopeKey
from provider.errors import LeaseGone

MEMORY_CAP: Final = 4_096
TTL_SECONDS: Final = 24 * 3600.0
RELEASED: Final = "was deleted when the lease was released"
DESTROYED: Final = "was deleted when the lease was destroyed"
EXPIRED: Final = "was deleted at its lease's deadline (requestedExpiresAt)"
NOT_FOUND: Final = "no longer exists (CreateOS answered 404 for it)"
SANDBOX_OPERATIONS: Final = frozenset({"start process", "run command", "read sandbox"})
"""Operations whose 404 means the sandbox itself is gone."""
_Key = tuple[str, str, str]


class GoneLeases:
    def __init__(
        self,
        journal: LeaseJournal,
        *,
        cap: int = MEMORY_CAP,
        ttl: float = TTL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._journal = journal
        self._cap = cap
        self._ttl = ttl
        self._clock = clock
        self._memory: OrderedDict[_Key, tuple[str, float]] = OrderedDict()

    async def mark(self, scope: ScopeKey, reason: str) -> None:
        """``scope``'s sandbox is gone; ``reason`` completes "Its sandbox <id> ..."."""
        self._remember(_key(scope), reason, self._clock())
        with anyio.CancelScope(shield=True):  # the fact must not be lost to a cancel
            await anyio.to_thread.run_sync(self._journal.add_gone, scope, reason)

    async def refuse(self, scope: ScopeKey) -> None:
        """Raise :class:`LeaseGone` when ``scope``'s sandbox is known to be gone."""
        reason = await self.reason(scope)
        if reason is not None:
            raise LeaseGone(
                f"This lease is gone: its sandbox {scope.lease_id} {reason}. Nothing was sent to "
                "CreateOS; acquire a new lease."
            )

    async def reason(self, scope: ScopeKey) -> str | None:
        """Why ``scope``'s sandbox is gone, or None when it is not known to be."""
        key, now = _key(scope), self._clock()
        known = self._memory.get(key)
        if known is not None:
            if now - known[1] < self._ttl:
                return known[0]
            del self._memory[key]
        row = await anyio.to_thread.run_sync(
            lambda: self._journal.gone(scope, since=now - self._ttl)
        )
        if row is None:
            return None
        self._remember(key, *row)
        return row[0]

    async def deleted_here(self, scope: ScopeKey) -> bool:
        """Whether this worker (or one before it) deleted ``scope``'s sandbox itself. A 404
        alone does not count: a release or destroy still sends its delete then, since a
        sandbox wrongly taken for gone would otherwise bill on."""
        return await self.reason(scope) in (RELEASED, DESTROYED)

    @asynccontextmanager
    async def on_not_found(self, scope: ScopeKey) -> AsyncIterator[None]:
        """Around a call's work: a 404 for ``scope``'s sandbox itself (not for a process or a
        file in it: :data:`SANDBOX_OPERATIONS`) marks it gone."""
        try:
            yield
        except NotFound as exc:
            if exc.operation in SANDBOX_OPERATIONS:
                await self.mark(scope, NOT_FOUND)
            raise

    def _remember(self, key: _Key, reason: str, at: float) -> None:
        self._memory[key] = (reason, at)
        self._memory.move_to_end(key)
        while len(self._memory) > self._cap:
            self._memory.popitem(last=False)


def _key(scope: ScopeKey) -> _Key:
    return (scope.api_url, scope.key_hash, scope.lease_id)
