"""The streamed exec's body (``/exec?stream=true``, docs/protocol.md C5): NDJSON frames as output
is read, heartbeats in silences, the leader's ``exit_code`` once both pipes reach EOF.

The command is driven by a task of the sandbox, not of the request: a client that hangs up (or
a fault that cuts the stream) closes the relay only, and the producer then keeps draining the
pipes and discarding what it reads, so the command neither blocks on a full pipe nor dies of
SIGPIPE (the worst case of an unknown; the real API may end the stream at the leader's exit).
"""

from __future__ import annotations

import codecs
import json
import signal
from collections.abc import AsyncIterator
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .guest import ChildWatch, ExitInfo
from .http_messages import Response, StreamCut
from .processes import run_exec
from .sandboxes import Sandbox
from .settings import Settings

NDJSON = "application/x-ndjson"
HEARTBEAT = b'{"hb":true}\n'
QUEUED_FRAMES = 64  # frames waiting for a slow reader before the pumps stop reading


def exit_code_of(info: ExitInfo) -> int:
    if info.signal is not None:
        return 128 + int(signal.Signals[info.signal])
    return info.code if info.code is not None else -1


def _line(frame: dict[str, Any]) -> bytes:
    return json.dumps(frame).encode() + b"\n"


def ndjson_lines(frames: list[dict[str, Any]]) -> Response:
    """A stream of fixed frames (a spawn failure's ``error`` then ``exit_code``)."""

    async def body() -> AsyncIterator[list[bytes]]:
        for frame in frames:
            yield [_line(frame)]

    return Response(200, content_type=NDJSON, stream=body())


def stream_exec(
    sandbox: Sandbox,
    fds: list[int],
    watch: ChildWatch,
    stdin: bytes,
    settings: Settings,
    cut_after_frames: int | None,
) -> Response:
    """Start driving a spawned command in the sandbox's task group; answer its frame stream.

    ``cut_after_frames`` (a fault): the stream closes abruptly after that many output frames
    (heartbeats do not count), the command runs on.
    """
    send, receive = anyio.create_memory_object_stream[dict[str, Any]](QUEUED_FRAMES)
    sandbox.start_soon(lambda: _produce(sandbox, fds, watch, stdin, settings, send))
    relay = _relay(receive, settings.heartbeat_ms / 1000, cut_after_frames)
    response = Response(200, content_type=NDJSON, stream=relay)
    if cut_after_frames is not None:
        response.headers.append(("X-Emulator-Cut", "frames"))
    return response


async def _produce(
    sandbox: Sandbox,
    fds: list[int],
    watch: ChildWatch,
    stdin: bytes,
    settings: Settings,
    out: MemoryObjectSendStream[dict[str, Any]],
) -> None:
    decoders = {
        name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")
    }
    listening = True

    async def offer(frame: dict[str, Any]) -> None:
        nonlocal listening
        if listening:
            try:
                await out.send(frame)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                listening = False  # nobody reads any more: drain and discard from now on

    async def forward(stream: str, data: bytes) -> None:
        text = decoders[stream].decode(data)
        if text:
            await offer({stream: text})

    async with out:
        assert sandbox.guest is not None
        info = await run_exec(sandbox.guest, fds, watch, stdin, settings, forward, until_eof=True)
        for name, decoder in decoders.items():
            tail = decoder.decode(b"", final=True)
            if tail:
                await offer({name: tail})
        await offer({"exit_code": exit_code_of(info)})


async def _relay(
    receive: MemoryObjectReceiveStream[dict[str, Any]], heartbeat: float, cut: int | None
) -> AsyncIterator[list[bytes]]:
    sent = 0
    async with receive:
        while True:
            frame: dict[str, Any] | None = None
            with anyio.move_on_after(heartbeat):
                try:
                    frame = await receive.receive()
                except anyio.EndOfStream:
                    return
            if frame is None:
                yield [HEARTBEAT]
                continue
            yield [_line(frame)]
            if cut is not None and "exit_code" not in frame:
                sent += 1
                if sent >= cut:
                    raise StreamCut("fault: cut after frames")
