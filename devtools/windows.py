"""Counting request starts in sliding windows: how the pacer's bound is checked and reported.

Shared by the pacer tests (``tests/createos/pacer/``) and ``bench/pacing.py``.
"""

from __future__ import annotations

from collections.abc import Sequence


def max_in_window(starts: Sequence[float], window: float) -> int:
    """The most starts in any closed window ``[t, t + window]`` (the worst window begins at a
    start, so sliding over the start times covers every window)."""
    times = sorted(starts)
    best = end = 0
    for begin, t in enumerate(times):
        while end < len(times) and times[end] <= t + window:
            end += 1
        best = max(best, end - begin)
    return best
