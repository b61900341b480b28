"""Command output handling: incremental UTF-8 decoding, the bounded tail, live-chunk splitting.

Sizes count Python characters (code points); upstream counts UTF-16 units (documented difference).
"""

from __future__ import annotations

import codecs
from collections import deque

DEFAULT_TAIL_LIMIT = 4 * 1024 * 1024  # characters kept per stream (spec 3.7)
LIVE_CHUNK_MAX = 500_000  # characters per execute.log notification
LIVE_BUDGET = 128 * 1024 * 1024  # characters of live chunks per execute call


class TailBuffer:
    """Keeps the last ``limit`` characters appended, in O(1) amortized time and bounded memory.

    Appended text is queued without copying; small appends are first gathered and joined into
    one piece of about ``SMALL_RUN`` characters, so a stream of tiny frames cannot pile up
    millions of string objects. Whole pieces leave the front once the rest still covers
    ``limit`` characters, so at most ``limit`` plus one piece (under ``2 * limit``) is held.
    A single append of ``limit`` or more replaces everything. Only :meth:`getvalue` joins it all.
    """

    SMALL_RUN = 65536  # characters of small appends joined into one piece
    SMALL_PIECES = 256  # ... or this many small appends, whichever comes first

    def __init__(self, limit: int = DEFAULT_TAIL_LIMIT) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self._limit = limit
        self._small = max(1, min(self.SMALL_RUN, limit // 8))
        self._pieces: deque[str] = deque()  # sealed pieces, oldest first
        self._run: list[str] = []  # small appends not yet joined (the newest text)
        self._run_len = 0
        self._held = 0  # characters in _pieces and _run
        self._total = 0

    def append(self, text: str) -> None:
        size = len(text)
        if not size:
            return
        self._total += size
        if size >= self._limit:
            self._pieces = deque((text[-self._limit :],))
            self._run.clear()
            self._run_len = 0
            self._held = self._limit
            return
        self._held += size
        if size >= self._small:
            self._seal_run()
            self._pieces.append(text)
        else:
            self._run.append(text)
            self._run_len += size
            if self._run_len >= self._small or len(self._run) >= self.SMALL_PIECES:
                self._seal_run()
        pieces = self._pieces
        while pieces and self._held - len(pieces[0]) >= self._limit:
            self._held -= len(pieces.popleft())

    def _seal_run(self) -> None:
        if self._run:
            self._pieces.append("".join(self._run))
            self._run.clear()
            self._run_len = 0

    @property
    def truncated(self) -> bool:
        """True once more than ``limit`` characters were ever appended."""
        return self._total > self._limit

    @property
    def held(self) -> int:
        """Characters currently held (under ``2 * limit``)."""
        return self._held

    @property
    def total(self) -> int:
        """Characters ever appended."""
        return self._total

    def getvalue(self) -> str:
        self._seal_run()
        joined = "".join(self._pieces)[-self._limit :]
        self._pieces = deque((joined,)) if joined else deque()
        self._held = len(joined)
        return joined


class StreamDecoder:
    """One stream's incremental UTF-8 decoder: split characters come out whole, bad bytes U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data, final=False)

    def flush(self) -> str:
        """Decode what is left; an incomplete trailing sequence becomes U+FFFD."""
        return self._decoder.decode(b"", final=True)


def split_chunks(text: str, max_len: int = LIVE_CHUNK_MAX) -> list[str]:
    """Split ``text`` into non-empty pieces of at most ``max_len`` characters.

    Never separates a surrogate pair (only possible in strings not produced by the decoder).
    """
    if max_len < 2:
        raise ValueError("max_len must be at least 2")
    pieces: list[str] = []
    start = 0
    end_of_text = len(text)
    while start < end_of_text:
        end = min(start + max_len, end_of_text)
        if (
            end < end_of_text
            and "\ud800" <= text[end - 1] <= "\udbff"
            and "\udc00" <= text[end] <= "\udfff"
        ):
            end -= 1
        pieces.append(text[start:end])
        start = end
    return pieces


class LiveBudget:
    """Caps the live output of one execute call at ``limit`` characters; later output stays only
    in the tail buffers (a command printing gigabytes must not flood the host)."""

    def __init__(self, limit: int = LIVE_BUDGET) -> None:
        self._limit = limit
        self._sent = 0
        self._exhausted = False

    def admit(self, text: str) -> str:
        """The part of ``text`` that may still be sent live (possibly empty)."""
        remaining = self._limit - self._sent
        if len(text) > remaining:
            self._exhausted = True
            text = text[: max(remaining, 0)]
        self._sent += len(text)
        return text

    @property
    def exhausted(self) -> bool:
        """True once some output was held back."""
        return self._exhausted

    @property
    def sent(self) -> int:
        return self._sent
