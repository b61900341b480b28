"""The streaming exec: ``POST /sandboxes/{id}/exec?stream=true`` (docs/protocol.md C5).

One request runs a command with its stdin in the body and answers NDJSON frames with one key
each until the exit code: ``{"stdout": text}``, ``{"stderr": text}``, ``{"hb": true}`` (about
every 5 s), ``{"error": text}`` and a final ``{"exit_code": N}``.
:meth:`ExecStreamCalls.exec_stream` opens it and yields :class:`ExecOutput`,
:class:`ExecError` and :class:`ExecExit` events;
heartbeats keep the read timeout from firing and are not passed on. Line rules are the
process stream's (:func:`~provider.createos.frames.ndjson_payload`); a frame without any of the
known keys is skipped (a newer server's extra), one with a known key of the wrong type is a
:class:`~provider.createos.errors.MalformedFrame`.

The exec is a POST: it is repeated only on 429 and 503 (nothing ran), never on a transport
error or once the stream has started. Older servers answer 404 for it: when a read of the sandbox
then succeeds, the origin is remembered as one without the stream (:func:`exec_stream_supported`)
and :class:`ExecStreamUnsupported` is raised, so callers fall back to managed processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from provider.createos.core import stream_timeout
from provider.createos.errors import MalformedFrame, NotFound
from provider.createos.frames import ndjson_payload
from provider.createos.models import require_id
from provider.createos.sandboxes import SandboxCalls
from provider.createos.wire import Wire

__all__ = [
    "ExecError",
    "ExecEvent",
    "ExecExit",
    "ExecOutput",
    "ExecStreamCalls",
    "ExecStreamUnsupported",
    "exec_stream_supported",
]

OPERATION: Final = "run command (stream)"
MAX_EXEC_LINE: Final = 16 * 1_048_576
"""A longer line is refused as malformed (no server sends one frame that large)."""
EXEC_READ_TIMEOUT: Final = 60.0
"""A stream silent this long is lost: the server sends a heartbeat about every 5 s."""

_STREAMLESS: set[str] = set()  # API base URLs that answered 404 for the stream


def exec_stream_supported(base_url: str) -> bool:
    """False once ``base_url`` has answered 404 for the exec stream (for this worker's life)."""
    return base_url.rstrip("/") not in _STREAMLESS


class ExecStreamUnsupported(NotFound):
    """The server has no exec stream (an older CreateOS): nothing ran."""


@dataclass(frozen=True, slots=True)
class ExecOutput:
    stream: str  # "stdout" or "stderr"
    text: str


@dataclass(frozen=True, slots=True)
class ExecError:
    message: str


@dataclass(frozen=True, slots=True)
class ExecExit:
    exit_code: int


ExecEvent = ExecOutput | ExecError | ExecExit


class _Frame(msgspec.Struct):
    stdout: Any = None
    stderr: Any = None
    error: Any = None
    exit_code: Any = None


_decoder = msgspec.json.Decoder(_Frame)


def _events(line: bytes | memoryview) -> list[ExecEvent]:
    payload = ndjson_payload(line)
    if payload is None:
        return []
    try:
        frame = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise MalformedFrame("CreateOS sent an exec stream line that is not a frame.") from exc
    events: list[ExecEvent] = []
    for stream in ("stdout", "stderr"):
        text = getattr(frame, stream)
        if text is not None:
            if not isinstance(text, str):
                raise MalformedFrame(f"CreateOS sent a non-text {stream} frame.")
            events.append(ExecOutput(stream, text))
    if frame.error is not None:
        events.append(ExecError(str(frame.error)[:500]))
    if frame.exit_code is not None:
        code = frame.exit_code
        if isinstance(code, bool) or not isinstance(code, int):
            raise MalformedFrame("CreateOS sent an exec exit frame without an integer code.")
        events.append(ExecExit(code))
    return events


class ExecStreamCalls(SandboxCalls):
    """``POST /sandboxes/{id}/exec?stream=true``."""

    @asynccontextmanager
    async def exec_stream(
        self,
        sandbox_id: str,
        cmd: str,
        args: Sequence[str],
        *,
        stdin: str | None = None,
        wire: Wire | None = None,
        read_timeout: float = EXEC_READ_TIMEOUT,
    ) -> AsyncIterator[AsyncIterator[ExecEvent]]:
        """Open the stream (module docstring); raises on enter for a refused request."""
        require_id(sandbox_id, "sandbox")
        body: dict[str, Any] = {"cmd": cmd, "args": list(args), "stream": True}
        if stdin is not None:
            body["stdin"] = stdin
        stream = self._stream(
            f"/sandboxes/{sandbox_id}/exec",
            operation=OPERATION,
            accept="application/x-ndjson",
            params={"stream": "true"},
            limits=stream_timeout(read_timeout),
            json=body,
            wire=wire,
        )
        async with AsyncExitStack() as stack:
            try:
                chunks = await stack.enter_async_context(stream)
            except NotFound as exc:
                await self.get_sandbox(sandbox_id)  # NotFound again: the sandbox is gone
                _STREAMLESS.add(self.base_url)
                raise ExecStreamUnsupported(
                    OPERATION, 404, message="This CreateOS server has no exec stream."
                ) from exc
            yield _read_events(chunks)


async def _read_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[ExecEvent]:
    pending = bytearray()
    async for chunk in chunks:
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", start)) >= 0:
            for event in _events(memoryview(pending)[start:end]):
                yield event
            start = end + 1
        del pending[:start]
        if len(pending) > MAX_EXEC_LINE:
            raise MalformedFrame("CreateOS sent an exec stream line longer than allowed.")
    for event in _events(bytes(pending)):
        yield event
