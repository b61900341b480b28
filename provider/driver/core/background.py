"""Work that runs beside the host's calls and outlives the call that started it.

A call's answer must never wait for housekeeping such as the reaper's sweep (docs/protocol.md
2.13), and a task started inside a request's task would die with it. ``BackgroundTasks`` owns
one task group for the worker's lifetime: the composition root enters :meth:`running` around
serving (``provider.driver.methods.background``), calls hand jobs to :meth:`start_soon`, and the
driver's shutdown :meth:`cancel`\\s whatever still runs.

Jobs are spawned by a task of their own that was started in the worker's root context, so they
never inherit the context (the invocation id) of the call that submitted them: like PTY output,
their log lines outlive that call and carry none. Jobs report their own failures; an exception
escaping one is dropped here so that background work can never take the worker down.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

Job = Callable[[], Awaitable[None]]


class BackgroundTasks:
    def __init__(self) -> None:
        self._send: MemoryObjectSendStream[Job] | None = None
        self._jobs_scope: anyio.CancelScope | None = None
        self._active = 0
        self._idle: anyio.Event | None = None

    @property
    def active(self) -> int:
        """Jobs submitted and not yet finished."""
        return self._active

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Accept jobs while the block runs; on exit every job still running is cancelled."""
        send, receive = anyio.create_memory_object_stream[Job](math.inf)
        async with anyio.create_task_group() as group:
            await group.start(self._spawner, receive)
            self._send = send
            try:
                yield
            finally:
                self._send = None
                send.close()
                group.cancel_scope.cancel()

    def start_soon(self, job: Job) -> bool:
        """Run ``job`` in the background; False (nothing runs) when not running or shut down."""
        if self._send is None:
            return False
        self._active += 1
        try:
            self._send.send_nowait(job)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._finished()
            return False
        return True

    def cancel(self) -> None:
        """Shutdown: cancel every job and accept no new ones."""
        if self._send is not None:
            self._send.close()
            self._send = None
        if self._jobs_scope is not None:
            self._jobs_scope.cancel()

    async def wait_idle(self) -> None:
        """Wait until every submitted job has finished (tests; never on a call's path)."""
        while self._active:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()

    async def _spawner(
        self,
        receive: MemoryObjectReceiveStream[Job],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        with receive:
            try:
                async with anyio.create_task_group() as jobs:
                    self._jobs_scope = jobs.cancel_scope
                    task_status.started()
                    async for job in receive:
                        jobs.start_soon(self._run, job)
            finally:
                while True:  # jobs cancelled before they were spawned
                    try:
                        receive.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                    self._finished()

    async def _run(self, job: Job) -> None:
        try:
            await job()
        except Exception:  # noqa: S110 - jobs log their own failures (module docstring)
            pass
        finally:
            self._finished()

    def _finished(self) -> None:
        self._active -= 1
        if self._active == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None
