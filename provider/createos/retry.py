"""Retry timing for the CreateOS client: backoff with jitter and ``Retry-After`` parsing."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Final

MAX_BACKOFF: Final = 30.0
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
