"""Interactive sessions: a remote process that outlives the call that opened it.

Login terminals (:mod:`provider.driver.interactive.login`) and duplex channels
(:mod:`provider.driver.interactive.channels`) share one life cycle (docs/protocol.md 6-7):

- the open reserves its route in the :class:`SessionTable` (so a close racing it can cancel
  it), starts one managed process and a *reader* in the worker's background tasks, and answers
  through :class:`provider.replies.AfterReply`: nothing naming the session is sent before the
  host has read that answer (``bound``);
- the reader follows the process's output to its end, forwards it (the subclass decides how),
  and then sends exactly one exit notification, after the last output. A stream that fails
  kills the process tree first;
- :meth:`RemoteSession.stop` is one ``DELETE ?grace_ms=1000`` under a fresh, shielded
  deadline (CreateOS sends SIGTERM to the whole tree, SIGKILL after the grace), which must
  confirm the tree is gone; otherwise the lease is poisoned and :class:`CleanupUnconfirmed` says
  so. Then the reader is cancelled (its exit still goes out). No separate ``/signal SIGTERM``
  goes first: the DELETE's own SIGTERM reaches every process it would have (the process group,
  or a terminal's foreground job) and more, so it would only cost a request.

The reader alone sends notifications for its session, so their order and the single exit hold
without locks; the host kills the worker on a frame for a pair it never bound, which is why
nothing is ever sent for a session whose open was not answered.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.errors import (
    APIStatusError,
    ReconnectBudgetExhausted,
)
from provider.createos.models import DataFrame, ExitFrame
from provider.createos.stream import follow_process_output
from provider.driver.commands.execute import ProcessRecord
from provider.driver.commands.sandbox_ops import kill_tree
from provider.driver.core.tracker import ScopeKey
from provider.driver.interactive.registry import LeaseRef
from provider.errors import CleanupUnconfirmed, ProviderError

Notify = Callable[[str, dict[str, Any]], Awaitable[None]]
Log = Callable[[str, str, dict[str, Any] | None], Awaitable[None]]

STOP_DEADLINE = 8.0  # a stop's own fresh deadline (the host waits 10 s for a close)
EXIT_DEADLINE = 5.0  # flushing output and sending the exit after the reader ended
OPEN_DEADLINE_CAP = 25.0  # the host waits 30 s for an open
ROUTE_MAX_CHARS = 200
SANDBOX_CWD = "/paperclip-workspace"


@dataclass(eq=False)
class RemoteSession:
    """One login terminal or duplex channel. Subclasses forward output and name the exit."""

    kind: str  # "login terminal" / "duplex channel", for messages
    route_id: str
    session_id: str
    ref: LeaseRef
    scope: ScopeKey
    client: CreateOSClient
    notify: Notify
    log: Log
    record: ProcessRecord
    poison: Callable[[], Awaitable[None]]
    process_id: str | None = None
    stopped: bool = False  # stop requested: no more input, the exit says null
    ended: bool = False  # the reader has finished (its exit was sent, if the pair was bound)
    exit: ExitFrame | None = None
    transport_closed: bool = False
    kill_on_end: bool = False  # the reader gave up on the stream: kill the tree at the end
    bound: anyio.Event = field(default_factory=anyio.Event)  # the host read the open's answer
    settled: anyio.Event = field(default_factory=anyio.Event)  # bound, or abandoned
    abandoned: bool = False  # the open failed or was cancelled: the host never knew the pair
    opened: anyio.Event = field(default_factory=anyio.Event)  # the output stream is attached
    stream_ended: anyio.Event = field(default_factory=anyio.Event)  # the reader stopped reading
    reader_done: anyio.Event = field(default_factory=anyio.Event)  # ... and sent its exit
    reader_scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    open_scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    opening: bool = True
    open_done: anyio.Event = field(default_factory=anyio.Event)
    reader_started: bool = False
    broken: bool = False  # an input failed: the child's stdin has a gap, no more input
    failure: BaseException | None = None  # why the reader stopped early, if it did
    input_lock: anyio.Lock = field(default_factory=anyio.Lock)
    stop_lock: anyio.Lock = field(default_factory=anyio.Lock)

    def mark_bound(self) -> None:
        """The open's answer is written: the session's notifications may follow."""
        self.bound.set()
        self.settled.set()

    def mark_abandoned(self) -> None:
        """The open did not answer: nothing may ever be sent for this pair."""
        self.abandoned = True
        self.settled.set()

    @property
    def live(self) -> bool:
        """Opened, answered, and neither ended nor being stopped: input is accepted."""
        return not (self.opening or self.ended or self.stopped or self.broken)

    async def wait_opened(self) -> None:
        """Until the reader has attached the output stream (and run :meth:`on_open`); raises
        what ended the reader if it ended first."""
        async with anyio.create_task_group() as group:

            async def until(event: anyio.Event) -> None:
                await event.wait()
                group.cancel_scope.cancel()

            group.start_soon(until, self.opened)
            group.start_soon(until, self.stream_ended)
        if not self.opened.is_set():
            if isinstance(self.failure, ProviderError):
                raise self.failure
            raise ProviderError(f"The {self.kind}'s process ended before its output was attached.")

    async def stop_quietly(self) -> None:
        """:meth:`stop`, an unconfirmed kill only logged (the lease is poisoned either way)."""
        try:
            await self.stop()
        except CleanupUnconfirmed as exc:
            await self.log("warn", f"{self.session_id}: {exc}", None)

    # -- subclass hooks ------------------------------------------------------------------------

    async def on_open(self) -> None:
        """Called once the output stream is attached (a duplex channel opens its gate)."""

    async def before_close(self) -> None:
        """Called by a close of a live session before it is stopped."""

    async def forward(self, frame: DataFrame) -> None:
        """Forward one data frame (called only once the pair is bound)."""
        raise NotImplementedError

    async def flush(self) -> None:
        """Forward whatever the decoders still hold (called only once the pair is bound)."""

    async def send_exit(self) -> None:
        raise NotImplementedError

    def exit_code(self) -> int | None:
        """The exit code the host is told: the process's own, null for anything else."""
        if self.stopped or self.kill_on_end or self.exit is None or self.exit.signal:
            return None
        return self.exit.exit_code

    # -- the reader ----------------------------------------------------------------------------

    async def read(self) -> None:
        """Follow the output to the exit (a background job); always ends with the exit."""
        assert self.process_id is not None
        try:
            with self.reader_scope:
                frames = follow_process_output(
                    self.client, self.scope.lease_id, self.process_id, on_open=self._attached
                )
                async with contextlib.aclosing(frames):
                    async for frame in frames:
                        if isinstance(frame, ExitFrame):
                            self.exit = frame
                            continue
                        await self.settled.wait()  # nothing goes out before the open's answer
                        if self.abandoned:
                            break
                        await self.forward(frame)
                        if self.kill_on_end:  # a subclass limit was reached
                            break
        except ReconnectBudgetExhausted as exc:
            self.failure, self.transport_closed, self.kill_on_end = exc, True, True
        except ProviderError as exc:
            self.failure, self.kill_on_end = exc, True
        finally:
            await self._finish()

    async def _attached(self) -> None:
        await self.on_open()
        self.opened.set()

    async def _finish(self) -> None:
        with anyio.CancelScope(shield=True):
            if self.kill_on_end and not self.stopped and self.process_id is not None:
                with anyio.move_on_after(STOP_DEADLINE):
                    if not await self._kill():
                        await self.log(
                            "warn",
                            f"{self.session_id}: the {self.kind}'s process could not be "
                            "confirmed stopped; the lease must be destroyed.",
                            None,
                        )
            elif self.exit is not None and self.process_id is not None:
                with anyio.move_on_after(EXIT_DEADLINE), contextlib.suppress(OSError):
                    await self.record.ended(self.process_id)
        self.ended = True
        self.stream_ended.set()
        try:
            # A process that ended before its open was answered still gets its exit, after
            # the answer; only the worker's shutdown cancels this wait.
            await self.settled.wait()
        finally:
            with anyio.CancelScope(shield=True):
                if self.bound.is_set():
                    with anyio.move_on_after(EXIT_DEADLINE):
                        await self.flush()
                        await self.send_exit()
                self.reader_done.set()

    # -- stop ----------------------------------------------------------------------------------

    async def stop(self, before: Callable[[], Awaitable[None]] | None = None) -> None:
        """A confirmed tree kill (one DELETE); a stop of an ended session does nothing.
        ``before`` runs first, under the same lock (a close's stdin close).

        Raises :class:`CleanupUnconfirmed` (after poisoning the lease) when the kill cannot be
        confirmed."""
        async with self.stop_lock:
            if self.ended or self.stopped or self.process_id is None:
                return
            if before is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_DEADLINE / 4):
                    await before()
            if self.stream_ended.is_set():  # the child ended on its own (EOF on its stdin)
                return
            self.stopped = True
            with anyio.CancelScope(shield=True):
                confirmed = False
                with anyio.move_on_after(STOP_DEADLINE):
                    confirmed = await self._kill()
                self.reader_scope.cancel()
                with anyio.move_on_after(EXIT_DEADLINE):
                    await self.reader_done.wait()
            if not confirmed:
                raise CleanupUnconfirmed(
                    f"Stopping the {self.kind}'s process ({self.process_id}) could not be "
                    "confirmed; it may still be running. Destroy the lease to recover."
                )

    async def _kill(self) -> bool:
        """DELETE the tree; True once it is confirmed gone (and forgotten by the journal)."""
        assert self.process_id is not None
        confirmed = await kill_tree(self.client, self.scope.lease_id, self.process_id)
        if confirmed:
            with contextlib.suppress(OSError):
                await self.record.ended(self.process_id)
        else:
            await self.poison()
        return confirmed


async def start_process(
    session: RemoteSession, *, script: str, login: bool, pty: tuple[int, int] | None
) -> None:
    """Create the session's process (3.4 rules: an answer lost to a 5xx leaves the creation
    unknown, which poisons the lease) and record it in the journal."""
    try:
        view = await session.client.create_process(
            session.scope.lease_id,
            cmd="/bin/bash",
            args=["-lc" if login else "-c", script],
            cwd=SANDBOX_CWD,
            pty=pty,
        )
    except APIStatusError as exc:
        if exc.rejected:
            raise
        await session.poison()
        raise CleanupUnconfirmed(
            f"Starting the {session.kind} failed in a way that leaves its outcome unknown: a "
            "process may be running unseen in the sandbox. Destroy the lease to recover."
        ) from exc
    except ProviderError as exc:
        if not isinstance(exc, APIStatusError):
            await session.poison()
            raise CleanupUnconfirmed(
                f"Starting the {session.kind} failed in a way that leaves its outcome unknown: "
                "a process may be running unseen in the sandbox. Destroy the lease to recover."
            ) from exc
        raise
    session.process_id = view.process_id
    await session.record.started(view.process_id)


class SessionTable:
    """Every session of this worker that is opening or live, and the routes it answered."""

    TOMBSTONES = 4096  # the host's own bound on closed routes

    def __init__(self) -> None:
        self._by_route: dict[tuple[str, str], RemoteSession] = {}  # (kind, route) -> session
        self._bound: OrderedDict[str, str] = OrderedDict()  # duplex route -> its session id

    def reserve(self, kind: str, session: RemoteSession) -> None:
        self._by_route[(kind, session.route_id)] = session

    def route_in_use(self, kind: str, route_id: str) -> bool:
        return (kind, route_id) in self._by_route

    def by_route(self, kind: str, route_id: str) -> RemoteSession | None:
        return self._by_route.get((kind, route_id))

    def by_session(self, kind: str, session_id: str) -> RemoteSession | None:
        for (k, _), session in self._by_route.items():
            if k == kind and session.session_id == session_id:
                return session
        return None

    def release(self, kind: str, session: RemoteSession) -> None:
        if self._by_route.get((kind, session.route_id)) is session:
            del self._by_route[(kind, session.route_id)]

    def remember_bound(self, route_id: str, session_id: str) -> None:
        self._bound.pop(route_id, None)
        self._bound[route_id] = session_id
        while len(self._bound) > self.TOMBSTONES:
            self._bound.popitem(last=False)

    def bound_session(self, route_id: str) -> str | None:
        return self._bound.get(route_id)

    def for_lease(self, ref: LeaseRef) -> list[tuple[str, RemoteSession]]:
        return [(kind, s) for (kind, _), s in self._by_route.items() if s.ref == ref]

    def everything(self) -> list[tuple[str, RemoteSession]]:
        return [(kind, s) for (kind, _), s in self._by_route.items()]

    def __iter__(self) -> Iterator[RemoteSession]:
        return iter(list(self._by_route.values()))
