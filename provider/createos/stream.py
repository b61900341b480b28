"""Following a managed process's NDJSON output to its exit (provider-behavior.md 3.5, 3.6).

:func:`follow_process_output` connects from ``after=0``, validates every frame, yields
:class:`DataFrame` and finally one :class:`ExitFrame`, and reconnects from the last seen ``seq``
when the connection fails (5xx or 429 at connect, a transport error, EOF without ``exit``).
Replayed frames (``seq <= cursor``) are skipped. Protocol errors are fatal and never
reconnected past. :class:`FrameParser` is the bytes-in, frames-out half, usable on its own.

Lines are split on ``b"\\n"`` before decoding; since ``\\n`` never occurs inside a multi-byte
UTF-8 sequence this is equivalent to decoding incrementally and splitting the text.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any, Final

import anyio
import anyio.lowlevel
import msgspec

from provider.createos.client import CreateOSClient
from provider.createos.errors import (
    APIConnectionError,
    MalformedFrame,
    MissingExitStatus,
    OutputEvicted,
    RateLimited,
    ReconnectBudgetExhausted,
    ServerError,
    StreamError,
    StreamGap,
)
from provider.createos.models import DataFrame, ExitFrame

__all__ = ["MAX_LINE_CHARS", "FrameParser", "follow_process_output"]

MAX_LINE_CHARS: Final = 1_048_576
MAX_SEQ: Final = 2**53 - 1
OPERATION: Final = "follow process output"
_SIGNAL_RE: Final = re.compile(r"SIG[A-Z0-9]+")
_CODE_RE: Final = re.compile(r"[a-z0-9_]{1,64}")
_BLANK: Final = frozenset(b" \t\r\n\x0b\x0c")


class _Frame(msgspec.Struct):
    """A line as decoded; fields are checked by hand (see :meth:`FrameParser._frame`).

    ``data_base64`` is decoded by msgspec itself, about three times faster than
    ``binascii.a2b_base64``. msgspec accepts exactly the spec's strict padded alphabet,
    ``^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$`` (empty allowed);
    anything else, or a non-string, fails the line as malformed. The tests hold it to that.
    """

    type: Any = None
    seq: Any = None
    stream: Any = None
    data_base64: bytes | None = None  # msgspec decodes strict padded base64 (see below)
    exit_code: Any = None
    signal: Any = None
    error: Any = None


_decoder: Final = msgspec.json.Decoder(_Frame)


def _integral(value: Any) -> int | None:
    """An int (or integral float) value; None for anything else, booleans included."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


class FrameParser:
    """Turns NDJSON body chunks into validated frames and tracks the ``seq`` cursor.

    One parser lives across reconnects (the cursor persists); :meth:`reset` drops a partial
    line left by a broken connection.
    """

    def __init__(self) -> None:
        self.cursor = 0
        self._pending: list[bytes | memoryview] = []
        self._pending_len = 0

    def reset(self) -> None:
        """Forget an unterminated line (the connection it came from is gone)."""
        self._pending.clear()
        self._pending_len = 0

    def feed(self, chunk: bytes) -> list[DataFrame | ExitFrame]:
        """The frames completed by ``chunk`` (heartbeats and replays are left out).

        Lines inside ``chunk`` are parsed from memoryview slices (no copy); only a line that
        spans chunks is joined.
        """
        end = chunk.find(b"\n")
        if end < 0:
            if chunk:
                self._pending.append(chunk)
                self._pending_len += len(chunk)
                self._check_tail()
            return []
        frames: list[DataFrame | ExitFrame] = []
        view = memoryview(chunk)
        if self._pending:
            self._pending.append(view[:end])
            line: bytes | memoryview = b"".join(self._pending)
            self.reset()
        else:
            line = view[:end]
        self._line(line, frames)
        start = end + 1
        end = chunk.find(b"\n", start)
        while end >= 0:
            self._line(view[start:end], frames)
            start = end + 1
            end = chunk.find(b"\n", start)
        if start < len(chunk):
            self._pending.append(view[start:])
            self._pending_len = len(chunk) - start
            self._check_tail()
        return frames

    def finish(self) -> list[DataFrame | ExitFrame]:
        """At a clean EOF: the unterminated last line, if any, is a line too."""
        frames: list[DataFrame | ExitFrame] = []
        if self._pending:
            line = b"".join(self._pending)
            self.reset()
            self._line(line, frames)
        return frames

    def _check_tail(self) -> None:
        if self._pending_len > MAX_LINE_CHARS:
            self._check_length(b"".join(self._pending), final=False)

    @staticmethod
    def _check_length(line: bytes | memoryview, *, final: bool) -> None:
        """Fatal when the line holds more than MAX_LINE_CHARS characters (replacement decode)."""
        if len(line) <= MAX_LINE_CHARS:
            return
        if len(line) > 4 * MAX_LINE_CHARS or (
            len(bytes(line).decode("utf-8", "replace" if final else "ignore")) > MAX_LINE_CHARS
        ):
            raise MalformedFrame("CreateOS output stream sent a line over 1,048,576 characters.")

    def _line(self, line: bytes | memoryview, frames: list[DataFrame | ExitFrame]) -> None:
        if not line or (line[0] in _BLANK and bytes(line).isspace()):
            return
        self._check_length(line, final=True)
        try:
            try:
                raw = _decoder.decode(line)
            except msgspec.ValidationError:
                raise
            except msgspec.DecodeError:
                # The spec decodes with replacement first; only invalid UTF-8 parses again.
                raw = _decoder.decode(bytes(line).decode("utf-8", "replace"))
        except msgspec.ValidationError as exc:
            raise MalformedFrame(
                "CreateOS output stream sent a frame with a field of the wrong type "
                "or data that is not strict base64."
            ) from exc
        except msgspec.DecodeError as exc:
            raise MalformedFrame(
                "CreateOS output stream sent a line that is not a JSON object."
            ) from exc
        frame = self._frame(raw)
        if frame is not None:
            frames.append(frame)

    def _frame(self, raw: _Frame) -> DataFrame | ExitFrame | None:
        kind = raw.type
        if kind == "data":
            return self._data(raw)
        if kind == "heartbeat":
            return None
        if kind == "exit":
            exit_code = _integral(raw.exit_code)
            signal = raw.signal
            if not (isinstance(signal, str) and _SIGNAL_RE.fullmatch(signal)):
                signal = None
            if exit_code is None and signal is None:
                raise MissingExitStatus(
                    "CreateOS output stream ended the process without an exit code or signal."
                )
            return ExitFrame(exit_code, signal)
        if kind == "error":
            if raw.error == "output_offset_expired":
                raise OutputEvicted(
                    OPERATION,
                    410,
                    message="CreateOS dropped unread process output (output_offset_expired).",
                )
            code = raw.error if isinstance(raw.error, str) else ""
            detail = f" ({code})" if _CODE_RE.fullmatch(code) else ""
            raise StreamError(f"CreateOS output stream reported an error{detail}.")
        raise MalformedFrame("CreateOS output stream sent a frame of unknown type.")

    def _data(self, raw: _Frame) -> DataFrame | None:
        seq = _integral(raw.seq)
        if seq is None or not 1 <= seq <= MAX_SEQ:
            raise MalformedFrame("CreateOS output stream sent a data frame with an invalid seq.")
        if seq <= self.cursor:
            return None
        if seq != self.cursor + 1:
            raise StreamGap(
                f"CreateOS output stream skipped from seq {self.cursor} to {seq}: output was lost."
            )
        stream = raw.stream
        if stream != "stdout" and stream != "stderr" and stream != "pty":
            raise MalformedFrame("CreateOS output stream sent a data frame for an unknown stream.")
        if raw.data_base64 is None:
            raise MalformedFrame("CreateOS output stream sent a data frame without data.")
        self.cursor = seq
        return DataFrame(seq, stream, raw.data_base64)


async def follow_process_output(
    client: CreateOSClient,
    sandbox_id: str,
    process_id: str,
    *,
    on_open: Callable[[], Awaitable[None]] | None = None,
    max_reconnects: int = 3,
    reconnect_delay: float = 0.25,
) -> AsyncGenerator[DataFrame | ExitFrame, None]:
    """Yield the process's data frames in ``seq`` order, then its :class:`ExitFrame`.

    ``on_open`` is awaited once, right after the first connection opens (its errors propagate).
    Reconnects (one budget for every cause): 5xx, 429 or a transport error at connect, a
    transport error while reading, EOF without ``exit``. More than ``max_reconnects`` raises
    :class:`ReconnectBudgetExhausted`. A 410 raises :class:`OutputEvicted`; other 4xx statuses
    and every protocol error are raised as they are.

    The open connection belongs to the generator: consumers that may stop early should wrap it
    in ``contextlib.aclosing`` so the stream closes at once rather than at garbage collection.
    """
    parser = FrameParser()
    reconnects = 0
    opened = False
    while True:
        failure: BaseException | None = None
        async with AsyncExitStack() as stack:
            try:
                body = await stack.enter_async_context(
                    client.connect(sandbox_id, process_id, after=parser.cursor)
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
        reconnects += 1
        if reconnects > max_reconnects:
            why = "the connection kept failing" if failure else "it kept ending before the exit"
            raise ReconnectBudgetExhausted(
                f"CreateOS output stream could not be followed to the process exit "
                f"({reconnects} connection attempts; {why})."
            ) from failure
        await anyio.sleep(reconnect_delay)
