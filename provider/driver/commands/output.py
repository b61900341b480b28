"""Command output handling: incremental UTF-8 decoding, the bounded tail, live chunks.

The tail counts Python characters (code points); upstream counts UTF-16 units (documented
difference). Live chunks are bounded the way the host checks them: the manager drops an
``execute.log`` whose ``chunk.length`` (JavaScript: UTF-16 units) is over 1,000,000, and stops
delivering once a call's chunks add up to 128 Mi UTF-16 units. A character above U+FFFF is two
such units, so both live bounds here count UTF-16 units, and chunks are cut between code points.
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

DEFAULT_TAIL_LIMIT: Final = 4 * 1024 * 1024  # characters kept per stream (docs/protocol.md 3.7)
LIVE_CHUNK_MAX: Final = 1_000_000  # UTF-16 units per execute.log (the host's own limit)
LIVE_BUDGET: Final = 128 * 1024 * 1024  # UTF-16 units of live chunks per call (the host's cap)


def utf16_len(text: str) -> int:
    """The length of ``text`` in UTF-16 units (JavaScript's ``length``): astral characters are 2."""
    if text.isascii():  # O(1) in CPython
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def utf16_cut(text: str, limit: int, start: int = 0) -> int:
    """The end of the longest ``text[start:end]`` of at most ``limit`` UTF-16 units.

    Cuts between code points only; ``end == start`` when ``limit`` is below the first
    character's width (a character above U+FFFF needs 2).
    """
    end = min(len(text), start + max(limit, 0))
    if text.isascii():
        return end
    units = utf16_len(text[start:end])
    while units > limit:
        # Each character is 1 or 2 units: dropping ``drop`` characters removes at most
        # 2 * drop units, so fewer than this can never be enough.
        drop = (units - limit + 1) // 2
        units -= utf16_len(text[end - drop : end])
        end -= drop
    return end


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


OutputSink = Callable[[str, str], Awaitable[None]]


@dataclass
class CommandOutput:
    """A command's output as it comes: relayed live to a sink, kept as two bounded tails."""

    stdout: TailBuffer = field(default_factory=TailBuffer)
    stderr: TailBuffer = field(default_factory=TailBuffer)

    async def emit(self, stream: str, text: str, sink: OutputSink | None) -> None:
        if not text:
            return
        if sink is not None:
            await sink(stream, text)
        (self.stdout if stream == "stdout" else self.stderr).append(text)

    @property
    def truncated(self) -> bool:
        return self.stdout.truncated or self.stderr.truncated


class StreamDecoder:
    """One stream's incremental UTF-8 decoder: split characters come out whole, bad bytes U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data, final=False)

    def flush(self) -> str:
        """Decode what is left; an incomplete trailing sequence becomes U+FFFD."""
        return self._decoder.decode(b"", final=True)


class LiveQueue:
    """Decoded output waiting to be sent live, in arrival order, taken as coalesced chunks.

    :meth:`take` returns the next ``execute.log`` chunk: the front piece merged with the pieces
    of the same stream right behind it, up to ``max_units`` UTF-16 units (a piece that does not
    fit whole is cut between code points, its rest stays in front). It never merges across a
    change of stream, so the order of stdout and stderr stays the order of arrival; whatever is
    queued goes out at once, a lone piece included (coalescing only gathers what piled up while
    the previous chunk was being written).
    """

    def __init__(self, max_units: int = LIVE_CHUNK_MAX) -> None:
        if max_units < 2:
            raise ValueError("max_units must be at least 2")
        self._max_units = max_units
        self._pieces: deque[tuple[str, str, int]] = deque()  # (stream, text, UTF-16 units)
        self._chars = 0

    def __len__(self) -> int:
        """Pieces queued."""
        return len(self._pieces)

    @property
    def chars(self) -> int:
        """Characters (code points) queued."""
        return self._chars

    def push(self, stream: str, text: str) -> None:
        if text:
            self._pieces.append((stream, text, utf16_len(text)))
            self._chars += len(text)

    def take(self) -> tuple[str, str] | None:
        """The next chunk as ``(stream, text)``, or None when nothing is queued."""
        pieces = self._pieces
        if not pieces:
            return None
        stream = pieces[0][0]
        parts: list[str] = []
        room = self._max_units
        while pieces and pieces[0][0] == stream and room > 0:
            _, text, units = pieces[0]
            if units <= room:
                pieces.popleft()
                parts.append(text)
                room -= units
                continue
            end = utf16_cut(text, room)
            if end == 0:  # only a 2-unit character would fit in 1 unit: end the chunk here
                break
            head = text[:end]
            head_units = utf16_len(head)
            pieces[0] = (stream, text[end:], units - head_units)
            parts.append(head)
            break
        chunk = parts[0] if len(parts) == 1 else "".join(parts)
        self._chars -= len(chunk)
        return stream, chunk


class LiveBudget:
    """Caps the live output of one execute call at ``limit`` UTF-16 units (the host's own count);
    later output stays only in the tail buffers (a command printing gigabytes must not flood
    the host, and a chunk past the host's cap would be dropped there)."""

    def __init__(self, limit: int = LIVE_BUDGET) -> None:
        self._limit = limit
        self._sent = 0
        self._exhausted = False

    def admit(self, text: str) -> str:
        """The part of ``text`` that may still be sent live (possibly empty; whole characters)."""
        if self._exhausted:
            return ""
        remaining = self._limit - self._sent
        units = utf16_len(text)
        if units > remaining:
            self._exhausted = True
            text = text[: utf16_cut(text, remaining)]
            units = utf16_len(text)
        self._sent += units
        return text

    @property
    def exhausted(self) -> bool:
        """True once some output was held back."""
        return self._exhausted

    @property
    def sent(self) -> int:
        """UTF-16 units admitted so far."""
        return self._sent
