"""The protocol pipe is grown so a live-output line goes out in one write."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from provider.rpc import stdio
from provider.rpc.stdio import PIPE_SIZE, FdReceiveStream, FdSendStream, LineReader

pytestmark = pytest.mark.anyio


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        with contextlib.suppress(OSError):
            os.close(fd)


def pipe_max_size() -> int:
    return int(Path("/proc/sys/fs/pipe-max-size").read_text())


async def test_a_send_stream_on_a_pipe_grows_it_and_lines_arrive_whole(
    pipe: tuple[int, int],
) -> None:
    read_fd, write_fd = pipe
    before = fcntl.fcntl(write_fd, fcntl.F_GETPIPE_SZ)
    assert before < PIPE_SIZE
    send = FdSendStream(write_fd)
    allowed = pipe_max_size() >= PIPE_SIZE or os.geteuid() == 0
    assert fcntl.fcntl(write_fd, fcntl.F_GETPIPE_SZ) == (PIPE_SIZE if allowed else before)
    line = b"x" * (300 * 1024) + b"\n"
    receive = FdReceiveStream(read_fd)
    reader = LineReader(receive)
    async with anyio.create_task_group() as tg:
        tg.start_soon(send.send, line * 5)
        for _ in range(5):
            assert await reader.receive_line() == line[:-1]
    await send.aclose()
    await receive.aclose()


async def test_a_bigger_pipe_is_never_shrunk(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, write_fd = pipe
    fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    monkeypatch.setattr(stdio, "PIPE_SIZE", PIPE_SIZE // 4)
    send = FdSendStream(write_fd)
    assert fcntl.fcntl(write_fd, fcntl.F_GETPIPE_SZ) == PIPE_SIZE
    await send.aclose()


async def test_a_regular_file_is_left_alone(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        send = FdSendStream(fd)
        await send.send(b"line\n")
        await send.aclose()
    finally:
        os.close(fd)
    assert (tmp_path / "out").read_bytes() == b"line\n"
