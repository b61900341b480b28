"""Command output handling: incremental UTF-8 decoding, the bounded tail, live-chunk splitting.

Sizes count Python characters (code points); upstream counts UTF-16 units (documented difference).
"""

from __future__ import annotations

import codecs

DEFAULT_TAIL_LIMIT = 4 * 1024 * 1024  # characters kept per stream (spec 3.7)
LIVE_CHUNK_MAX = 500_000  # characters per execute.log notification
LIVE_BUDGET = 128 * 1024 * 1024  # characters of live chunks per execute call


class TailBuffer:
    """Keeps the last ``limit`` characters appended.

    Appends are amortized O(1): pieces are kept in a list and compacted to the last ``limit``
    characters once more than ``2 * limit`` are held, so memory stays within about twice the limit
    however much is appended. A single append of ``limit`` or more replaces everything.
    """

    def __init__(self, limit: int = DEFAULT_TAIL_LIMIT) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self._limit = limit
        self._pieces: list[str] = []
        self._held = 0
        self._total = 0

    def append(self, text: str) -> None:
        if not text:
            return
        self._total += len(text)
        if len(text) >= self._limit:
            self._pieces = [text[-self._limit :]]
            self._held = self._limit
            return
        self._pieces.append(text)
        self._held += len(text)
        if self._held > 2 * self._limit:
            self._compact()

    def _compact(self) -> None:
        joined = "".join(self._pieces)[-self._limit :]
        self._pieces = [joined] if joined else []
        self._held = len(joined)

    @property
    def truncated(self) -> bool:
        """True once more than ``limit`` characters were ever appended."""
        return self._total > self._limit

    @property
    def held(self) -> int:
        """Characters currently held (at most ``2 * limit``)."""
        return self._held

    @property
    def total(self) -> int:
        """Characters ever appended."""
        return self._total

    def getvalue(self) -> str:
        self._compact()
        return self._pieces[0] if self._pieces else ""


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
