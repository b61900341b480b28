"""Waiting on a real condition instead of a fixed sleep: poll it, bounded by a deadline."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

import anyio


async def wait_until(
    condition: Callable[[], object | Awaitable[object]],
    *,
    timeout: float = 20.0,
    poll: float = 0.02,
) -> None:
    """Return as soon as ``condition()`` (a plain or an async callable) is true; fail with
    ``TimeoutError`` when it is still false after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        while True:
            answer = condition()
            if inspect.isawaitable(answer):
                answer = await answer
            if answer:
                return
            await anyio.sleep(poll)
