"""Big lines on a real pipe: a reply that takes the host long to read still arrives whole, and a
cancelled write never leaves a cut line behind (the cut line would swallow the next one)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import struct
import termios
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio.streams.memory import MemoryObjectSendStream

from provider.rpc import dispatcher as dispatcher_module
from provider.rpc.dispatcher import Dispatcher
from provider.rpc.stdio import FdReceiveStream, FdSendStream, LineReader
from tests.rpc.harness import MemoryByteReceiveStream
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        with contextlib.suppress(OSError):
            os.close(fd)


def _fill(fd: int) -> int:
    """Write into ``fd`` (non-blocking) until the pipe is full; returns the bytes written."""
    os.set_blocking(fd, False)
    total = 0
    while True:
        try:
            total += os.write(fd, b"f" * 65536)
        except BlockingIOError:
            return total


def _pipe_full(read_fd: int) -> bool:
    """Whether the pipe holds as many bytes as it can (its writer must now wait)."""
    (queued,) = struct.unpack("i", fcntl.ioctl(read_fd, termios.FIONREAD, struct.pack("i", 0)))
    return int(queued) >= fcntl.fcntl(read_fd, fcntl.F_GETPIPE_SZ)


async def _read_exactly(receive: FdReceiveStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        data += await receive.receive(size - len(data))
    return bytes(data)


async def test_a_cancelled_send_keeps_its_rest_and_writes_it_before_the_next_item(
    pipe: tuple[int, int],
) -> None:
    read_fd, write_fd = pipe
    send = FdSendStream(write_fd)
    filler = _fill(write_fd)
    first = b"A" * (3 * MIB) + b"\n"
    with anyio.move_on_after(0.1) as timer:
        await send.send(first)  # nothing can be written: the pipe is full
    assert timer.cancelled_caught
    assert send.unwritten == len(first)  # owned by the stream, not dropped
    receive = FdReceiveStream(read_fd)
    assert await _read_exactly(receive, filler) == b"f" * filler
    with anyio.move_on_after(0.1) as timer:
        await send.send(b"never cut\n")  # writes some of the rest, then waits again
    assert timer.cancelled_caught
    assert 0 < send.unwritten < len(first) + len(b"never cut\n")

    reader = LineReader(receive)
    async with anyio.create_task_group() as tg:
        tg.start_soon(send.send, b"last\n")  # the rest of both, then its own line
        assert await reader.receive_line() == first[:-1]
        assert await reader.receive_line() == b"never cut"
        assert await reader.receive_line() == b"last"
    assert send.unwritten == 0
    await send.aclose()
    await receive.aclose()


async def test_a_send_on_a_closed_reader_is_broken_and_stays_broken(
    pipe: tuple[int, int],
) -> None:
    read_fd, write_fd = pipe
    send = FdSendStream(write_fd)
    os.close(read_fd)
    for _ in range(2):
        with pytest.raises(anyio.BrokenResourceError):
            await send.send(b"x\n")
    assert send.unwritten == 0
    await send.aclose()


@asynccontextmanager
async def _serving_on_pipe(
    dispatcher: Dispatcher, write_fd: int
) -> AsyncIterator[MemoryObjectSendStream[bytes]]:
    """Serve with input from memory and output on the real pipe ``write_fd``."""
    to_worker, worker_input = anyio.create_memory_object_stream[bytes](math.inf)
    send = FdSendStream(write_fd)
    async with anyio.create_task_group() as tg:
        tg.start_soon(dispatcher.serve, MemoryByteReceiveStream(worker_input), send)
        try:
            yield to_worker
        finally:
            await to_worker.aclose()
    worker_input.close()
    await send.aclose()


def _request(request_id: int, method: str) -> bytes:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {}}
    return json.dumps(message).encode() + b"\n"


async def _slow_lines(read_fd: int, count: int, *, pause: float) -> list[dict[str, Any]]:
    """Read ``count`` lines 256 KiB at a time with a ``pause`` after each read."""
    receive = FdReceiveStream(read_fd)
    buffer = bytearray()
    lines: list[dict[str, Any]] = []
    with anyio.fail_after(60):
        while len(lines) < count:
            buffer += await receive.receive(256 * 1024)
            while (end := buffer.find(b"\n")) >= 0:
                lines.append(json.loads(bytes(buffer[:end]).decode("utf-8")))
                del buffer[: end + 1]
            await anyio.sleep(pause)
    await receive.aclose()
    return lines


async def test_a_big_reply_the_host_reads_slowly_still_arrives_whole(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bug: every reply was written under a 1 s budget, so a result the host needed longer
    # to read was cut mid-line and the host never got an answer. Writing it may take as long
    # as the host reads; only the shutdown bounds it.
    monkeypatch.setattr(dispatcher_module, "REPLY_BUDGET_S", 0.2)
    read_fd, write_fd = pipe
    big = "😀" * (2 * MIB)  # 8 MiB of UTF-8: ~32 reads of 256 KiB, 30 ms apart

    async def execute(params: dict[str, Any]) -> dict[str, Any]:
        return {"stdout": big, "stderr": "€" * MIB}

    dispatcher = Dispatcher({"environmentExecute": execute}, initialized=True)
    async with _serving_on_pipe(dispatcher, write_fd) as to_worker:
        await to_worker.send(_request(1, "environmentExecute") + _request(2, "health"))
        lines = await _slow_lines(read_fd, 2, pause=0.03)
    assert lines[0]["id"] == 1
    assert lines[0]["result"]["stdout"] == big
    assert lines[0]["result"]["stderr"] == "€" * MIB
    assert lines[1] == {"jsonrpc": "2.0", "id": 2, "result": {"status": "ok"}}


async def test_a_notification_cancelled_mid_line_is_finished_before_the_reply(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The handler is cancelled by the shutdown while its 3 MiB notification waits for room in
    # the pipe; the host must still read whole lines: the notification, then the replies.
    monkeypatch.setattr(dispatcher_module, "SHUTDOWN_BUDGET_S", 2.0)
    read_fd, write_fd = pipe
    chunk = "é" * (3 * MIB // 2)
    started = anyio.Event()
    dispatcher: Dispatcher

    async def execute(params: dict[str, Any]) -> None:
        started.set()
        await dispatcher.notify("execute.log", {"stream": "stdout", "chunk": chunk})
        await anyio.sleep_forever()

    dispatcher = Dispatcher({"environmentExecute": execute}, initialized=True)
    async with _serving_on_pipe(dispatcher, write_fd) as to_worker:
        await to_worker.send(_request(1, "environmentExecute"))
        await started.wait()
        await wait_until(lambda: _pipe_full(read_fd))  # the notification fills it and waits
        await to_worker.send(_request(2, "shutdown"))
        lines = await _slow_lines(read_fd, 3, pause=0.01)
    assert lines[0]["method"] == "execute.log"
    assert lines[0]["params"]["chunk"] == chunk
    assert lines[1]["id"] == 1 and "shutting down" in lines[1]["error"]["message"]
    assert lines[2] == {"jsonrpc": "2.0", "id": 2, "result": None}


async def test_the_shutdown_still_ends_when_the_host_stops_reading_a_big_reply(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatcher_module, "SHUTDOWN_BUDGET_S", 0.3)
    monkeypatch.setattr(dispatcher_module, "CANCEL_GRACE_S", 0.1)
    monkeypatch.setattr(dispatcher_module, "REPLY_BUDGET_S", 0.2)
    read_fd, write_fd = pipe
    replying = anyio.Event()

    async def execute(params: dict[str, Any]) -> dict[str, Any]:
        replying.set()
        return {"stdout": "x" * (4 * MIB)}  # more than the pipe holds; nobody reads it

    dispatcher = Dispatcher({"environmentExecute": execute}, initialized=True)
    with anyio.fail_after(5):
        async with _serving_on_pipe(dispatcher, write_fd) as to_worker:
            await to_worker.send(_request(1, "environmentExecute"))
            await replying.wait()
            await wait_until(lambda: _pipe_full(read_fd))  # the reply waits for room
            await to_worker.send(_request(2, "shutdown"))
            await dispatcher.stop()
