"""Virtual time for the pacer tests, and helpers they share.

:class:`VirtualTimeLoop` is an asyncio loop whose clock jumps to the next timer whenever nothing
is ready, and the pacers read that clock (``anyio.current_time``). So the window bound, FIFO
order, cancellation and 429 holds are checked at exact times, fast and deterministically.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio

from devtools.windows import max_in_window
from provider.createos.pacer import (
    CAPACITY,
    DEFAULT_INTERVAL,
    RequestPacer,
)

ORIGIN = "http://127.0.0.1:8790"
TAU = DEFAULT_INTERVAL
EPS = 1e-9  # float rounding of virtual times
WINDOWS = (1, 5, 10, 60)
MINUTE_BUDGET = 280  # CreateOS allows 300 a minute per IP; 20 stay for other clients
REPO = Path(__file__).resolve().parents[3]
T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    """Never sleeps: a select with a timeout and nothing ready moves the loop's clock instead."""

    loop: VirtualTimeLoop

    def select(self, timeout: float | None = None) -> Any:
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:  # no timer at all: only real I/O could wake the loop
            ready = super().select(10.0)
            if not ready:
                raise RuntimeError("virtual-time loop: no timer and no I/O (a deadlock)")
            return ready
        self.loop.virtual_now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.virtual_now = 1000.0
        selector = _JumpingSelector()
        selector.loop = self
        super().__init__(selector)

    def time(self) -> float:
        return self.virtual_now


def run_virtual(func: Callable[[], Awaitable[T]]) -> T:
    return anyio.run(func, backend="asyncio", backend_options={"loop_factory": VirtualTimeLoop})


def virtual_pacer(
    shared_dir: Path | None, starts: list[float] | None = None, interval: float = TAU
) -> RequestPacer:
    on_start = starts.append if starts is not None else None
    return RequestPacer(
        ORIGIN,
        interval=interval,
        shared_dir=shared_dir,
        clock=anyio.current_time,
        on_start=on_start,
    )


def assert_window_bound(starts: Sequence[float], interval: float = TAU) -> None:
    """No window of T seconds (scaled with the interval) holds more than 40 + 4·T starts (at
    most 280 in a minute)."""
    for seconds in WINDOWS:
        window = seconds * interval / TAU
        most = max_in_window(starts, window)
        assert most <= CAPACITY + 4 * seconds, (seconds, most, len(starts))
    assert max_in_window(starts, 60 * interval / TAU) <= MINUTE_BUDGET


async def drain(pacer: RequestPacer) -> None:
    for _ in range(CAPACITY):
        await pacer.wait_turn()
