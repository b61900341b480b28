"""Retry timing for the CreateOS client: backoff with jitter, ``Retry-After`` parsing, and
whether a wait may start at all (the caller's anyio deadline)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Final

import anyio

MAX_BACKOFF: Final = 30.0
MAX_RETRY_AFTER: Final = 600.0
"""The longest ``Retry-After`` a call without an anyio deadline waits for (with a deadline, the
deadline decides): a longer hint reads as a quota, not as "retry shortly"."""
_SECONDS = re.compile(r"\d+(?:\.\d+)?")


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date).

    A date in the past gives 0. Anything unparseable gives None (no hint).
    """
    if value is None:
        return None
    text = value.strip()
    if _SECONDS.fullmatch(text):
        seconds = float(text)
        return seconds if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = now if now is not None else datetime.now(UTC)
    return max(0.0, (when - current).total_seconds())


def backoff_delay(
    attempt: int,
    base: float,
    retry_after: float | None,
    *,
    jitter: Callable[[float, float], float],
) -> float:
    """The wait before retry number ``attempt + 1``.

    ``Retry-After`` wins; otherwise ``min(base * 2**attempt + jitter(0, base), 30)``. With the
    default ``base`` of 0.5 s this is the SDKs' ``0.5 s * 2^n + U(0, 0.5 s)``.
    """
    if retry_after is not None:
        return retry_after
    return min(base * 2.0**attempt + jitter(0.0, base), MAX_BACKOFF)


def wait_refused(delay: float) -> str | None:
    """Why a wait of ``delay`` seconds may not start (None: it may): it would pass the caller's
    anyio deadline, or, without a deadline, it is longer than :data:`MAX_RETRY_AFTER`."""
    left = anyio.current_effective_deadline() - anyio.current_time()
    if math.isinf(left):
        if delay <= MAX_RETRY_AFTER:
            return None
        return f"longer than the {MAX_RETRY_AFTER:.0f} s a call without a deadline waits"
    if delay < left:
        return None
    return f"past this operation's deadline ({max(left, 0.0):.0f} s left)"
