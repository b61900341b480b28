"""Live output relay: ``execute.log`` notifications sent from their own task.

Following a process's output and writing its live chunks to the host are two stages of one
pipeline. Done in one task, a host that is briefly slow to drain its pipe (on a busy machine the
host, the worker and the provider all compete for the CPU) stalls the reading of the output
stream too, and with it the provider's process. :class:`LiveRelay` queues the chunks (bounded by
characters) and a writer task sends them in order, so the reader keeps going while the host
catches up. The call's result is only answered after the queue has drained: the host drops
chunks that arrive after the reply.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio

from provider.driver.commands.output import LIVE_CHUNK_MAX, LiveBudget, LiveQueue

Notify = Callable[[str, dict[str, Any]], Awaitable[None]]
QUEUE_CHARS: Final = 4 * 1024 * 1024  # characters waiting for the writer at most (plus one put)
PUT_SLICE: Final = LIVE_CHUNK_MAX // 2  # characters queued at a time by one put (<= the bound)


class LiveRelay:
    """Queues live output for :meth:`run` to send as ``execute.log`` notifications, in order.

    ``put`` applies the call's :class:`LiveBudget`, queues the text and waits while
    ``max_chars`` are already queued or being sent. ``run`` sends what is queued as soon as it
    is there, coalesced: each notification takes the pieces of one stream that piled up while
    the previous one was being written, up to the host's chunk limit (:class:`LiveQueue`), so
    a host slow to read gets fewer, bigger messages and a lone piece is never held back.
    ``run`` returns once :meth:`close` was called and every queued piece was sent.
    """

    def __init__(
        self, notify: Notify, *, budget: LiveBudget | None = None, max_chars: int = QUEUE_CHARS
    ) -> None:
        self._notify = notify
        self._budget = budget if budget is not None else LiveBudget()
        self._max_chars = max_chars
        self._queue = LiveQueue()
        self._queued_chars = 0  # queued or in the notification being written
        self._closed = False
        self._changed = anyio.Event()

    @property
    def queued_chars(self) -> int:
        return self._queued_chars

    def _signal(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def put(self, stream: str, text: str) -> None:
        """Queue ``text`` (already decoded) of ``stream``; waits while the queue is full."""
        if self._closed:
            raise RuntimeError("the live relay is closed")
        text = self._budget.admit(text)
        for start in range(0, len(text), PUT_SLICE):
            piece = text[start : start + PUT_SLICE]
            while self._queued_chars and self._queued_chars + len(piece) > self._max_chars:
                await self._changed.wait()
            self._queue.push(stream, piece)
            self._queued_chars += len(piece)
            self._signal()

    def close(self) -> None:
        """No more output: :meth:`run` ends once the queue is empty."""
        self._closed = True
        self._signal()

    async def run(self) -> None:
        """Send the queued output in order until closed and drained."""
        while True:
            while (taken := self._queue.take()) is not None:
                stream, chunk = taken
                await self._notify("execute.log", {"stream": stream, "chunk": chunk})
                self._queued_chars -= len(chunk)
                self._signal()
            if self._closed:
                return
            await self._changed.wait()
