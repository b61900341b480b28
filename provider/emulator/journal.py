"""The output journal of one managed process: seq-numbered data frames, eviction, readers.

Each chunk read from a process pipe becomes one or more data frames, encoded to their NDJSON line
once (``head + base64 + FRAME_TAIL``) so replay and every live reader send the same bytes without
re-encoding. One ``seq`` counter per process across streams, starting at 1.

Retention: about ``journal_bytes`` of raw output; the oldest frames are evicted to make room.
While an attached reader has not yet sent the oldest frame, the appender waits (backpressure on
the producing process, whose pipe then fills) for up to ``backpressure_ms``; after that, or with
no reader attached, it evicts, and a reader left behind gets the ``output_offset_expired`` frame.
"""

from __future__ import annotations

import binascii
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio

from .http_messages import StreamCut

FRAME_MAX = 128 * 1024  # raw bytes per data frame (at most a quarter of the journal)
FRAME_TAIL = b'"}\n'
MAX_FRAMES = 65536  # bound on retained frame objects whatever their size
HEARTBEAT_LINE = b'{"type":"heartbeat"}\n'


@dataclass(slots=True)
class Frame:
    seq: int
    nbytes: int
    head: bytes
    b64: bytes


@dataclass
class JournalLimits:
    """Live view of the settings the journal obeys (read on every append)."""

    journal_bytes: int = 1 << 20
    backpressure_ms: int = 10_000


class Cursor:
    """One attached reader: ``position`` is the last seq it has handed to its socket."""

    __slots__ = ("position",)

    def __init__(self, position: int) -> None:
        self.position = position


def expired_line(oldest: int) -> bytes:
    return b'{"type":"error","error":"output_offset_expired","oldest_available_seq":%d}\n' % oldest


class Journal:
    """Frames of one process, retained window, attached cursors and the final exit line."""

    def __init__(self, limits: Callable[[], JournalLimits]) -> None:
        self._limits = limits
        self._frames: list[Frame] = []
        self._head = 0  # index of the oldest retained frame in _frames
        self._bytes = 0
        self._next_seq = 1
        self._cursors: set[Cursor] = set()
        self._changed = anyio.Event()
        self.exit_line: bytes | None = None
        self.total_bytes = 0

    # -- views --------------------------------------------------------------------------
    @property
    def oldest_seq(self) -> int:
        return self._frames[self._head].seq if self._head < len(self._frames) else self._next_seq

    @property
    def newest_seq(self) -> int:
        return self._next_seq - 1

    @property
    def retained_bytes(self) -> int:
        return self._bytes

    @property
    def finished(self) -> bool:
        return self.exit_line is not None

    def describe(self) -> dict[str, int]:
        return {"oldest_seq": self.oldest_seq, "newest_seq": self.newest_seq, "bytes": self._bytes}

    def expired(self, after: int) -> bool:
        """True when frames after ``after`` were already evicted (boundary: oldest - 1 is ok)."""
        return after < self.oldest_seq - 1

    def frames_after(self, position: int, max_bytes: int, max_frames: int) -> list[Frame]:
        start = self._head + max(0, position + 1 - self.oldest_seq)
        out: list[Frame] = []
        size = 0
        for i in range(start, min(len(self._frames), start + max_frames)):
            frame = self._frames[i]
            out.append(frame)
            size += frame.nbytes
            if size >= max_bytes:
                break
        return out

    # -- changes ------------------------------------------------------------------------
    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_change(self) -> None:
        await self._changed.wait()

    def attach(self, position: int) -> Cursor:
        cursor = Cursor(position)
        self._cursors.add(cursor)
        return cursor

    def detach(self, cursor: Cursor) -> None:
        self._cursors.discard(cursor)
        self._notify()

    def advanced(self) -> None:
        """A cursor moved forward: wake a producer waiting for room."""
        self._notify()

    async def append(self, stream: str, data: bytes | memoryview) -> None:
        """Journal one chunk read from ``stream``; may wait for a slow attached reader."""
        step = min(FRAME_MAX, max(1024, self._limits().journal_bytes // 4))
        for start in range(0, len(data), step):
            piece = data[start : start + step] if len(data) > step else data
            await self._make_room(len(piece))
            seq = self._next_seq
            self._next_seq += 1
            head = b'{"type":"data","seq":%d,"stream":"%s","data_base64":"' % (
                seq,
                stream.encode(),
            )
            self._frames.append(
                Frame(seq, len(piece), head, binascii.b2a_base64(piece, newline=False))
            )
            self._bytes += len(piece)
            self.total_bytes += len(piece)
            self._notify()

    async def _make_room(self, incoming: int) -> None:
        deadline: float | None = None
        while self._head < len(self._frames):
            limits = self._limits()
            retained = len(self._frames) - self._head
            if self._bytes + incoming <= limits.journal_bytes and retained < MAX_FRAMES:
                return
            oldest = self._frames[self._head].seq
            # A cursor blocks eviction only while the oldest frame is the next one it needs; one
            # already further behind has expired and will get the error frame.
            if limits.backpressure_ms > 0 and any(c.position == oldest - 1 for c in self._cursors):
                now = anyio.current_time()
                if deadline is None:
                    deadline = now + limits.backpressure_ms / 1000
                if now < deadline:
                    with anyio.move_on_after(deadline - now):
                        await self.wait_change()
                    continue
            self._evict_one()
        self._compact()

    def _evict_one(self) -> None:
        frame = self._frames[self._head]
        self._bytes -= frame.nbytes
        self._head += 1
        self._compact()
        self._notify()

    def _compact(self) -> None:
        if self._head > 1024 and self._head * 2 > len(self._frames):
            del self._frames[: self._head]
            self._head = 0

    def evict_through(self, seq: int) -> int:
        """Drop every retained frame with ``seq <= seq`` (admin); returns the new oldest seq."""
        while self._head < len(self._frames) and self._frames[self._head].seq <= seq:
            self._evict_one()
        self._notify()
        return self.oldest_seq

    def finish(self, exit_line: bytes) -> None:
        if self.exit_line is None:
            self.exit_line = exit_line
            self._notify()


BATCH_BYTES = 1 << 20
BATCH_FRAMES = 256


async def follow(
    journal: Journal, after: int, heartbeat_s: float, frame_limit: int | None = None
) -> AsyncIterator[list[bytes]]:
    """NDJSON body of ``connect``: replay after ``after``, follow live, then the exit line.

    Yields lists of buffers (one HTTP chunk each). The cursor advances when a batch is taken;
    the next batch is only taken once the consumer asks for it, i.e. after the previous one
    reached the socket, so a slow reader holds back the producer (one batch plus the journal
    in flight) instead of losing data. With ``frame_limit``
    the stream ends (without an exit line) after that many data frames.
    """
    cursor = journal.attach(after)
    sent = 0
    try:
        while True:
            if journal.expired(cursor.position):
                yield [expired_line(journal.oldest_seq)]
                return
            limit = BATCH_FRAMES if frame_limit is None else min(BATCH_FRAMES, frame_limit - sent)
            frames = journal.frames_after(cursor.position, BATCH_BYTES, limit)
            if frames:
                buffers: list[bytes] = []
                for frame in frames:
                    buffers += (frame.head, frame.b64, FRAME_TAIL)
                # The batch holds its frames: the journal may evict them while it is being
                # written, so the producer keeps encoding during the socket copy.
                cursor.position = frames[-1].seq
                sent += len(frames)
                journal.advanced()
                yield buffers
                if frame_limit is not None and sent >= frame_limit:
                    raise StreamCut("fault: cut after frames")
                continue
            if journal.exit_line is not None:
                yield [journal.exit_line]
                return
            with anyio.move_on_after(heartbeat_s) as scope:
                await journal.wait_change()
            if scope.cancelled_caught:
                yield [HEARTBEAT_LINE]
    finally:
        journal.detach(cursor)
