"""What login terminals and duplex channels share around their sessions: the opening checks,
the open itself, closing, and tearing a lease's sessions down (docs/protocol.md 2.12, 6, 7).

:class:`Interactive` holds the :class:`SessionTable` and the lease registry. Opens carry no
config or key, so they find their lease in the registry; every check of 6.1.1 runs before any
HTTP request. The open runs as a tracked operation of its lease (a release cancels it) inside
its own cancel scope (a close of its route cancels it); whatever it created is killed if it
does not finish. Release, destroy and shutdown call :meth:`close_lease` / :meth:`close_all`
first; an unconfirmed stop poisons the lease, which makes a reuse release refuse.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from provider.driver.core.keepalive import keepalive
from provider.driver.core.params import RouteOpenParams
from provider.driver.core.process_records import JournaledProcesses
from provider.driver.core.runtime import BoundCall, DriverRuntime, deadline
from provider.driver.interactive.registry import LeaseRef, LeaseRegistry
from provider.driver.interactive.sessions import (
    OPEN_DEADLINE_CAP,
    ROUTE_MAX_CHARS,
    STOP_DEADLINE,
    Log,
    Notify,
    RemoteSession,
    SessionTable,
)
from provider.errors import CleanupUnconfirmed, OperationCancelled, ProviderError, RequestRefused
from provider.replies import AfterReply

S = TypeVar("S", bound=RemoteSession)
CLOSE_BUDGET = 8.0  # per close; the host waits 10 s and kills the worker after that


@dataclass(frozen=True)
class Registered:
    """A lease's latest owned call, and its warm window (keepalive reads while a session runs)."""

    call: BoundCall
    window: int | None = None


@dataclass(frozen=True)
class OpenTarget:
    """An open's checked identity: its route, its lease and that lease's latest binding."""

    route_id: str
    ref: LeaseRef
    call: BoundCall
    window: int | None = None


class Interactive:
    def __init__(self, runtime: DriverRuntime, *, notify: Notify, log: Log) -> None:
        self.runtime = runtime
        self.notify = notify
        self.log = log
        self.table = SessionTable()
        self.registry: LeaseRegistry[Registered] = LeaseRegistry()

    # -- the registry ----------------------------------------------------------------------

    def register(self, call: BoundCall, lease_id: str | None, window: int | None = None) -> None:
        if lease_id:
            ref = LeaseRef(call.company_id, call.environment_id, lease_id)
            self.registry.register(ref, Registered(call, window))

    def forget(self, call: BoundCall, lease_id: str | None) -> None:
        if lease_id:
            self.registry.remove(LeaseRef(call.company_id, call.environment_id, lease_id))

    # -- opening ---------------------------------------------------------------------------

    def check_open(self, kind: str, params: RouteOpenParams, method: str) -> OpenTarget:
        """6.1.1 (and 7.1.1): every refusal before any HTTP request."""
        if self.runtime.tracker.shutting_down:
            raise RequestRefused(f"Cannot open a {kind}: the worker is shutting down.")
        route = params.hostRouteId
        if not route or len(route) > ROUTE_MAX_CHARS:
            raise RequestRefused(
                f"{method} needs a hostRouteId of 1 to {ROUTE_MAX_CHARS} characters."
            )
        if self.table.route_in_use(kind, route):
            raise RequestRefused(f"A {kind} is already open on this hostRouteId.")
        if params.driverKey != "createos":
            raise RequestRefused(f"{method} is for the createos driver only.")
        ref = LeaseRef(params.companyId, params.environmentId, params.providerLeaseId)
        found = self.registry.lookup(ref)
        if found is None:
            raise RequestRefused(
                f"This worker holds no such lease (it was released, or the worker restarted); "
                f"start the {kind} again."
            )
        self.runtime.tracker.check_usable(found.call.scope(ref.lease_id), f"open a {kind}")
        return OpenTarget(route, ref, found.call, found.window)

    def new_session(
        self, factory: Callable[..., S], kind: str, target: OpenTarget, prefix: str
    ) -> S:
        call = target.call
        scope = call.scope(target.ref.lease_id)
        runtime = self.runtime

        async def poison() -> None:
            await runtime.poison(scope)

        return factory(
            kind=kind,
            route_id=target.route_id,
            session_id=f"{prefix}-{uuid.uuid4()}",
            ref=target.ref,
            scope=scope,
            client=runtime.client_factory(call.config, call.api_key),
            notify=self.notify,
            log=self.log,
            record=JournaledProcesses(runtime.journal, scope),
            poison=poison,
        )

    async def open(
        self,
        session: RemoteSession,
        target: OpenTarget,
        start: Callable[[RemoteSession], Awaitable[None]],
        result: dict[str, Any],
        on_bound: Callable[[], None] | None = None,
    ) -> AfterReply:
        """Run ``start`` (create the process, start the reader) under the open's deadline and
        cancel scopes; answer ``result`` once the pair may be used, else clean up.

        ``on_bound`` runs once the answer is written; an answer that was not written (see
        :class:`AfterReply`) abandons the session instead, since the host never bound it."""
        kind = session.kind
        self.table.reserve(kind, session)
        timeout = min(target.call.timeout, OPEN_DEADLINE_CAP)
        try:
            async with self.runtime.tracker.track(session.scope, kind):
                with session.open_scope, deadline(timeout, f"Opening the {kind}"):
                    await start(session)
            if session.open_scope.cancelled_caught:
                raise OperationCancelled(f"The {kind} was closed while it was opening.")
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._abandon(session)
            raise
        finally:
            session.opening = False
            session.open_done.set()

        def answered(delivered: bool) -> None:
            if delivered:
                if on_bound is not None:
                    on_bound()
                session.mark_bound()
            elif not self.runtime.background.start_soon(lambda: self._unanswered(session)):
                session.mark_abandoned()  # shutting down: close_all stops what is left

        return AfterReply(result, answered)

    async def _unanswered(self, session: RemoteSession) -> None:
        """The open's answer never reached the host: stop the session without a word to it."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_DEADLINE):
            await self._abandon(session)

    def start_reader(self, session: RemoteSession, window: int | None = None) -> None:
        """Run the session's reader as background work; it leaves the table when it ends.
        On a warm lease (``window``) keepalive reads run as long as the session does."""
        kind = session.kind
        runtime = self.runtime

        async def job() -> None:
            try:
                async with keepalive(
                    runtime.background,
                    session.client,
                    session.scope.lease_id,
                    window,
                    runtime.keepalive_interval,
                ):
                    await session.read()
            finally:
                self.table.release(kind, session)
                with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_DEADLINE):
                    async with session.stop_lock, session.input_lock:  # none still uses it
                        await session.client.aclose()

        session.reader_started = True
        if not self.runtime.background.start_soon(job):
            raise ProviderError(f"Cannot open a {kind}: the worker is not serving.")

    async def _abandon(self, session: RemoteSession) -> None:
        """A failed or cancelled open: kill what it created, forget the route."""
        session.mark_abandoned()
        try:
            if not session.reader_started:
                session.reader_done.set()
            if session.process_id is not None:
                session.opening = False
                await session.stop()
        except CleanupUnconfirmed:
            await self.log(
                "warn",
                f"{session.session_id}: the process of a {session.kind} that failed to open "
                "could not be confirmed stopped; the lease must be destroyed.",
                None,
            )
        finally:
            self.table.release(session.kind, session)
            if not session.reader_started:
                with anyio.move_on_after(1.0):
                    await session.client.aclose()

    # -- closing ---------------------------------------------------------------------------

    async def close(self, session: RemoteSession) -> None:
        """Close one session (bounded): cancel its open, or stop it (a channel closes its
        stdin first). An unconfirmed stop is logged (the lease is poisoned), never raised: a
        failed close makes the host kill the whole worker."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_BUDGET):
            if session.opening:
                session.open_scope.cancel()
                await session.open_done.wait()
                if session.abandoned:  # the open's cleanup stopped what it had started
                    await session.reader_done.wait()
                    return
            try:
                await session.stop(before=session.before_close)
            except CleanupUnconfirmed as exc:
                await self.log("warn", f"{session.session_id}: {exc}", None)
            await session.reader_done.wait()

    async def close_lease(self, ref: LeaseRef) -> None:
        """Release and destroy: close every session of the lease first (concurrently)."""
        await self._close_all([s for _, s in self.table.for_lease(ref)])

    async def close_all(self) -> None:
        """Shutdown: close every session (the caller bounds the total)."""
        await self._close_all(list(self.table))

    async def _close_all(self, sessions: list[RemoteSession]) -> None:
        async with anyio.create_task_group() as group:
            for session in sessions:
                group.start_soon(self.close, session)
