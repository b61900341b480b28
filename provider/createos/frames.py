"""The bytes-in, frames-out half of following a process's output (docs/protocol.md 3.6).

:class:`FrameParser` turns ``connect`` body chunks into validated :class:`DataFrame` and
:class:`ExitFrame` objects and tracks the ``seq`` cursor; protocol errors are fatal.

**SSE tolerance.** Both official SDKs read every NDJSON stream leniently, and so do we
(:func:`ndjson_payload`): blank lines, ``:`` comment lines (a proxy's ``: keepalive``) and
``event:``, ``id:`` and ``retry:`` lines are skipped, and a ``data:`` prefix (with one optional
space) is stripped. Anything else that is not a JSON object stays a :class:`MalformedFrame`.
The exec stream has the same line rules, so its readers use :func:`ndjson_payload` too.

Lines are split on ``b"\\n"`` before decoding; since ``\\n`` never occurs inside a multi-byte
UTF-8 sequence this is equivalent to decoding incrementally and splitting the text.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from provider.createos.errors import (
    MalformedFrame,
    MissingExitStatus,
    OutputEvicted,
    StreamError,
    StreamGap,
)
from provider.createos.models import DataFrame, ExitFrame

__all__ = ["MAX_LINE_CHARS", "OPERATION", "FrameParser", "ndjson_payload"]

MAX_LINE_CHARS: Final = 1_048_576
MAX_SEQ: Final = 2**53 - 1
OPERATION: Final = "follow process output"
_SIGNAL_RE: Final = re.compile(r"SIG[A-Z0-9]+")
_CODE_RE: Final = re.compile(r"[a-z0-9_]{1,64}")
_BLANK: Final = frozenset(b" \t\r\n\x0b\x0c")
_OPEN_BRACE: Final = ord("{")
_SSE_SKIPPED: Final = (b":", b"event:", b"id:", b"retry:")
_SSE_DATA: Final = b"data:"


def ndjson_payload(line: bytes | memoryview) -> bytes | memoryview | None:
    """The JSON text of one stream line (its ``\n`` removed), or None for a line to skip:
    blank, an SSE comment (``:``) or an ``event:``/``id:``/``retry:`` line. A ``data:`` prefix
    and one space after it are stripped. Any other line is returned as it is (a line that is not
    JSON then fails to decode: the caller's MalformedFrame)."""
    if not line:
        return None
    if line[0] == _OPEN_BRACE:  # the NDJSON fast path: no copy, no prefix checks
        return line
    head = bytes(line[:6])
    if head.startswith(_SSE_SKIPPED):
        return None
    if head.startswith(_SSE_DATA):
        line = line[6:] if head[5:6] == b" " else line[5:]
    if not line or (line[0] in _BLANK and bytes(line).isspace()):
        return None
    return line


class _Frame(msgspec.Struct):
    """A line as decoded; fields are checked by hand (see :meth:`FrameParser._frame`).

    ``data_base64`` is decoded by msgspec itself, about three times faster than
    ``binascii.a2b_base64``. msgspec accepts exactly the strict padded alphabet of 3.6,
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

    def _line(self, raw_line: bytes | memoryview, frames: list[DataFrame | ExitFrame]) -> None:
        line = ndjson_payload(raw_line)
        if line is None:
            return
        self._check_length(line, final=True)
        try:
            try:
                raw = _decoder.decode(line)
            except msgspec.ValidationError:
                raise
            except msgspec.DecodeError:
                # 3.6 decodes with replacement first; only invalid UTF-8 parses again.
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
