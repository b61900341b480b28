"""Per-lease bookkeeping inside one worker: active work, closing leases, poisoned leases.

A lease is identified by its :class:`ScopeKey` (company, environment, API origin, a hash of the
API key, provider lease id), so two environments that happen to share a sandbox id never share
state. For each scope the tracker knows:

- the tracked operations (execute, sync) running on it, each with a cancel scope and a
  completion event, so a release can cancel them and wait until their cleanup has finished;
- whether a release or destroy of it is in progress (``closing``);
- whether it is *unconfirmed*: a remote process may be running unseen (process creation or a
  tree kill could not be confirmed). Only a destroy clears that mark.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio

from provider.errors import OperationCancelled, RequestRefused


@dataclass(frozen=True)
class ScopeKey:
    company_id: str
    environment_id: str
    api_url: str
    key_hash: str
    lease_id: str

    @classmethod
    def build(
        cls, *, company_id: str, environment_id: str, api_url: str, api_key: str, lease_id: str
    ) -> ScopeKey:
        key_hash = hashlib.sha256(api_key.encode("utf-8")).hexdigest()
        return cls(company_id, environment_id, api_url, key_hash, lease_id)


@dataclass(eq=False)
class TrackedOperation:
    """One execute or sync running on a lease."""

    kind: str
    cancel_scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)
    cancel_reason: str | None = None

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.cancel_scope.cancel()


class LeaseTracker:
    """In-worker lease state (see module docstring)."""

    def __init__(self) -> None:
        self._operations: dict[ScopeKey, set[TrackedOperation]] = {}
        self._closing: set[ScopeKey] = set()
        self._unconfirmed: set[ScopeKey] = set()
        self.shutting_down = False
        #: called with (scope, True) when a scope becomes unconfirmed and (scope, False) when it
        #: is cleared; a durable journal can subscribe here.
        self.on_unconfirmed_change: Callable[[ScopeKey, bool], None] | None = None

    # -- marks -------------------------------------------------------------------------------

    def is_closing(self, scope: ScopeKey) -> bool:
        return scope in self._closing

    def is_unconfirmed(self, scope: ScopeKey) -> bool:
        return scope in self._unconfirmed

    def unconfirmed_scopes(self) -> frozenset[ScopeKey]:
        return frozenset(self._unconfirmed)

    def mark_unconfirmed(self, scope: ScopeKey) -> None:
        if scope not in self._unconfirmed:
            self._unconfirmed.add(scope)
            if self.on_unconfirmed_change is not None:
                self.on_unconfirmed_change(scope, True)

    def clear_unconfirmed(self, scope: ScopeKey) -> None:
        if scope in self._unconfirmed:
            self._unconfirmed.discard(scope)
            if self.on_unconfirmed_change is not None:
                self.on_unconfirmed_change(scope, False)

    def active_operations(self, scope: ScopeKey) -> list[TrackedOperation]:
        return list(self._operations.get(scope, ()))

    # -- guards ------------------------------------------------------------------------------

    def check_usable(self, scope: ScopeKey, action: str) -> None:
        """Refuse work on a lease that is being torn down or must be destroyed first."""
        if self.shutting_down:
            raise RequestRefused(f"Cannot {action}: the worker is shutting down.")
        if scope in self._closing:
            raise RequestRefused(
                f"Cannot {action}: a release or destroy of this lease is in progress."
            )
        if scope in self._unconfirmed:
            raise RequestRefused(
                f"Cannot {action}: a command on this lease may still be running because its "
                "cleanup could not be confirmed. Destroy the lease to recover."
            )

    # -- tracked work ------------------------------------------------------------------------

    @asynccontextmanager
    async def track(self, scope: ScopeKey, kind: str) -> AsyncIterator[TrackedOperation]:
        """Run the body as a tracked operation that a release, destroy or shutdown can cancel.

        When cancelled that way, the body's own cleanup (shielded) runs first, then
        :class:`OperationCancelled` is raised in place of the cancellation.
        """
        self.check_usable(scope, f"run {kind}")
        op = TrackedOperation(kind)
        self._operations.setdefault(scope, set()).add(op)
        try:
            with op.cancel_scope:
                yield op
        finally:
            ops = self._operations.get(scope)
            if ops is not None:
                ops.discard(op)
                if not ops:
                    del self._operations[scope]
            op.done.set()
        if op.cancel_scope.cancelled_caught:
            raise OperationCancelled(
                f"The {kind} was cancelled because {op.cancel_reason or 'the lease was released'}."
            )

    @asynccontextmanager
    async def closing(self, scope: ScopeKey, reason: str) -> AsyncIterator[None]:
        """Mark the lease as closing, cancel its tracked work and wait for it to finish."""
        if scope in self._closing:
            raise RequestRefused("Another release or destroy of this lease is already in progress.")
        self._closing.add(scope)
        try:
            await self.cancel_and_wait(self.active_operations(scope), reason)
            yield
        finally:
            self._closing.discard(scope)

    async def cancel_and_wait(self, operations: list[TrackedOperation], reason: str) -> None:
        for op in operations:
            op.cancel(reason)
        for op in operations:
            await op.done.wait()

    async def shutdown(self, *, budget: float) -> None:
        """Refuse new work, cancel every tracked operation and wait (bounded) for its cleanup."""
        self.shutting_down = True
        everything = [op for ops in self._operations.values() for op in ops]
        with anyio.move_on_after(budget):
            await self.cancel_and_wait(everything, "the worker is shutting down")
