"""Following a managed process's NDJSON output to its exit (docs/protocol.md 3.5, 3.6).

:func:`follow_process_output` connects from ``after=0``, validates every frame (with
:class:`~provider.createos.frames.FrameParser`), yields :class:`DataFrame` and finally one
:class:`ExitFrame`, and reconnects from the last seen ``seq`` when the connection fails (5xx or
429 at connect, a transport error, EOF without ``exit``). Replayed frames (``seq <= cursor``)
are skipped. Protocol errors are fatal and never reconnected past.

**Silent commands.** CreateOS documents heartbeats on the exec stream only, so a ``connect``
may stay silent as long as its command does. A read that waits ``silence_limit`` seconds for a
byte (60 s by default) ends the connection, and the process is then read (``GET``): when it
still runs and has no output past the cursor, the command is silent, not the stream lost, so
the stream is followed again without spending the reconnect budget. Otherwise the silence
counts as a failed connection. So a truly dead connection is still replaced within the limit,
at the cost of two requests per silent minute.

**The budget.** ``max_reconnects`` counts failed connections since the last progress: a
connection that delivered new output (the cursor moved) starts a fresh budget, so a long
command survives any number of spaced-out cuts while a stream that keeps failing without
output still ends.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Final

import anyio
import anyio.lowlevel

from provider.createos.client import CreateOSClient
from provider.createos.core import STREAM_READ_TIMEOUT
from provider.createos.errors import (
    APIConnectionError,
    APITimeout,
    CreateOSError,
    OutputEvicted,
    RateLimited,
    ReconnectBudgetExhausted,
    ServerError,
)
from provider.createos.frames import MAX_LINE_CHARS, FrameParser
from provider.createos.models import DataFrame, ExitFrame

__all__ = ["MAX_LINE_CHARS", "FrameParser", "follow_process_output"]

CHECK_LIMIT: Final = 30.0
"""How long the process read after a silent stream may take; longer counts as a failure."""


async def _silent_but_running(
    client: CreateOSClient, sandbox_id: str, process_id: str, cursor: int
) -> bool:
    """After a stream went silent: True when the process still runs and its output journal
    holds nothing past ``cursor`` (the command is silent, not the stream lost)."""
    with anyio.move_on_after(CHECK_LIMIT):
        try:
            view = await client.get_process(sandbox_id, process_id)
        except CreateOSError:
            return False
        newest = view.newest_seq
        return view.running and (newest is None or newest <= cursor)
    return False


async def follow_process_output(
    client: CreateOSClient,
    sandbox_id: str,
    process_id: str,
    *,
    on_open: Callable[[], Awaitable[None]] | None = None,
    max_reconnects: int = 3,
    reconnect_delay: float = 0.25,
    silence_limit: float = STREAM_READ_TIMEOUT,
) -> AsyncGenerator[DataFrame | ExitFrame, None]:
    """Yield the process's data frames in ``seq`` order, then its :class:`ExitFrame`.

    ``on_open`` is awaited once, right after the first connection opens (its errors propagate).
    Reconnects (one budget for every cause): 5xx, 429 or a transport error at connect, a
    transport error while reading, EOF without ``exit``, and a silence of ``silence_limit``
    seconds unless the process read shows a silent command (see the module docstring). More
    than ``max_reconnects`` since the last new output raises :class:`ReconnectBudgetExhausted`.
    A 410 raises :class:`OutputEvicted`; other 4xx statuses and every protocol error are raised
    as they are.

    The open connection belongs to the generator: consumers that may stop early should wrap it
    in ``contextlib.aclosing`` so the stream closes at once rather than at garbage collection.
    """
    parser = FrameParser()
    reconnects = attempts = 0
    opened = False
    while True:
        failure: BaseException | None = None
        start = parser.cursor
        attempts += 1
        async with AsyncExitStack() as stack:
            try:
                body = await stack.enter_async_context(
                    client.connect(
                        sandbox_id, process_id, after=parser.cursor, read_timeout=silence_limit
                    )
                )
            except OutputEvicted:
                raise
            except (ServerError, RateLimited, APIConnectionError) as exc:
                failure = exc
            else:
                if not opened:
                    opened = True
                    if on_open is not None:
                        await on_open()
                parser.reset()
                try:
                    async for chunk in body:
                        for frame in parser.feed(chunk):
                            yield frame
                            if isinstance(frame, ExitFrame):
                                return
                except APIConnectionError as exc:
                    failure = exc
                else:
                    for frame in parser.finish():
                        yield frame
                        if isinstance(frame, ExitFrame):
                            return
        await anyio.lowlevel.checkpoint_if_cancelled()  # a pending cancel wins over a reconnect
        if parser.cursor > start:
            reconnects = 0  # this connection delivered new output: a fresh budget
        if isinstance(failure, APITimeout) and await _silent_but_running(
            client, sandbox_id, process_id, parser.cursor
        ):
            continue  # a silent command: follow it again at once, budget untouched
        reconnects += 1
        if reconnects > max_reconnects:
            why = "the connection kept failing" if failure else "it kept ending before the exit"
            raise ReconnectBudgetExhausted(
                f"CreateOS output stream could not be followed to the process exit "
                f"({attempts} connection attempts, {reconnects} since its last output; {why})."
            ) from failure
        await anyio.sleep(reconnect_delay)
