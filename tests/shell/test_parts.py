"""The helper's parts without a sandbox: exit codes, the terminal size, raw mode, status lines,
keystroke batching and the client's ``/resize`` call."""

from __future__ import annotations

import json
import os
import termios
from collections.abc import Iterator
from typing import cast

import anyio
import httpx
import pytest

from provider.createos.client import CreateOSClient
from provider.createos.errors import Conflict, CreateOSError, NotFound
from provider.createos.models import ExitFrame, ProcessView
from provider.createos.pacer import RequestPacer
from provider.createos.processes import MAX_INPUT_BYTES, MAX_PTY_SIDE
from provider.shell import session, terminal
from provider.shell.session import Ended, _Relay, exit_code_of

from .local_pty import set_size


@pytest.fixture
def pty_pair() -> Iterator[tuple[int, int]]:
    master, slave = os.openpty()
    yield master, slave
    os.close(master)
    os.close(slave)


def test_exit_codes() -> None:
    assert exit_code_of(ExitFrame(3, None)) == 3
    assert exit_code_of(ExitFrame(0, None)) == 0
    assert exit_code_of(ExitFrame(None, "SIGKILL")) == 1
    assert exit_code_of(ExitFrame(0, "SIGTERM")) == 1
    assert exit_code_of(ExitFrame(300, None)) == 1
    assert exit_code_of(ExitFrame(-1, None)) == 1


def test_terminal_size(pty_pair: tuple[int, int]) -> None:
    _master, slave = pty_pair
    read_end, write_end = os.pipe()
    try:
        assert terminal.terminal_size(read_end, write_end) == terminal.DEFAULT_SIZE == (24, 80)
        set_size(slave, 33, 111)
        assert terminal.terminal_size(read_end, slave) == (33, 111)
        set_size(slave, 0, 0)  # a pty nobody sized
        assert terminal.terminal_size(slave) == (24, 80)
        set_size(slave, 5000, 3)
        assert terminal.terminal_size(slave) == (1000, 3)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert terminal.MAX_SIDE == MAX_PTY_SIDE


def test_raw_mode_is_restored_on_every_way_out(pty_pair: tuple[int, int]) -> None:
    _master, slave = pty_pair
    cooked = termios.tcgetattr(slave)
    with pytest.raises(RuntimeError), terminal.raw_mode(slave) as raw:
        assert raw is True
        lflag = termios.tcgetattr(slave)[3]
        assert not lflag & (termios.ECHO | termios.ICANON | termios.ISIG)
        raise RuntimeError("boom")
    assert termios.tcgetattr(slave) == cooked
    read_end, write_end = os.pipe()
    try:
        with terminal.raw_mode(read_end) as raw:
            assert raw is False
    finally:
        os.close(read_end)
        os.close(write_end)


def test_status_lines_end_in_cr_lf_and_start_a_fresh_line_when_asked() -> None:
    read_end, write_end = os.pipe()
    terminal.write_status("connected", fd=write_end)
    terminal.write_status("\nthe end", fd=write_end)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        assert pipe.read() == b"provider shell: connected\r\n\r\nprovider shell: the end\r\n"
    terminal.write_status("to no terminal", fd=-1)  # EBADF is not an error


class _SlowInput:
    """Records ``/input`` batches; the first request waits until released."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.release = anyio.Event()

    async def write_input(self, sandbox_id: str, process_id: str, data: bytes) -> None:
        self.batches.append(data)
        if len(self.batches) == 1:
            await self.release.wait()


@pytest.mark.anyio
async def test_keystrokes_queued_during_a_request_go_out_together_within_the_limit() -> None:
    stub = _SlowInput()
    relay = _Relay(
        cast(CreateOSClient, stub), "sb_1", stdin_fd=0, stdout_fd=1, status=lambda _m: None
    )
    send, receive = anyio.create_memory_object_stream[bytes](session.INPUT_QUEUE_CHUNKS)
    big = 100 * 1024
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay._send_keys, "proc_1", receive)
        await send.send(b"l")
        with anyio.fail_after(5):
            while not stub.batches:
                await anyio.sleep(0.01)
        for key in (b"s", b"\r", b"x" * big, b"y" * big, b"z" * big):
            await send.send(key)  # typed while the first request is in flight
        stub.release.set()
        with anyio.fail_after(5):
            while sum(map(len, stub.batches)) < 3 + 3 * big:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    send.close()
    assert stub.batches == [b"l", b"s\r" + b"x" * big + b"y" * big, b"z" * big]
    assert all(len(b) <= MAX_INPUT_BYTES for b in stub.batches)


def _client(handler: httpx.MockTransport) -> CreateOSClient:
    origin = "http://127.0.0.1:9"
    return CreateOSClient(origin, "k", pacer=RequestPacer(origin, interval=0), transport=handler)


@pytest.mark.anyio
async def test_resize_process_posts_rows_and_cols() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"status": "success", "data": {"ok": True}})

    async with _client(httpx.MockTransport(answer)) as client:
        await client.resize_process("sb_1", "proc_2", rows=33, cols=111)
        for rows, cols in ((0, 80), (24, 1001), (True, 80), (24, 80.0)):
            with pytest.raises(ValueError):
                await client.resize_process("sb_1", "proc_2", rows=rows, cols=cols)  # type: ignore[arg-type]
    assert len(seen) == 1
    assert seen[0].method == "POST"
    assert seen[0].url.path == "/v1/sandboxes/sb_1/processes/proc_2/resize"
    assert json.loads(seen[0].content) == {"rows": 33, "cols": 111}


class _RefusingInput:
    """``/input`` answers each scripted error in turn (then accepts); ``get_process`` tells
    whether the shell has exited."""

    def __init__(self, errors: list[CreateOSError], *, exited: bool) -> None:
        self.errors = errors
        self.exited = exited
        self.batches: list[bytes] = []

    async def write_input(self, sandbox_id: str, process_id: str, data: bytes) -> None:
        self.batches.append(data)
        if self.errors:
            raise self.errors.pop(0)

    async def get_process(self, sandbox_id: str, process_id: str) -> ProcessView:
        state = "exited" if self.exited else "running"
        return ProcessView(process_id, state, leader_exited=self.exited)


async def _feed(stub: object, keys: list[bytes]) -> tuple[list[str], Ended | None]:
    said: list[str] = []
    relay = _Relay(cast(CreateOSClient, stub), "sb_1", stdin_fd=0, stdout_fd=1, status=said.append)
    send, receive = anyio.create_memory_object_stream[bytes](session.INPUT_QUEUE_CHUNKS)
    with anyio.move_on_after(1):
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay._send_keys, "proc_1", receive)
            for key in keys:
                await send.send(key)
                await anyio.sleep(0.05)
    send.close()
    return said, relay._ended


@pytest.mark.anyio
async def test_input_refused_by_a_busy_shell_loses_those_keys_only() -> None:
    stub = _RefusingInput([Conflict("write process input", 409)], exited=False)
    said, ended = await _feed(stub, [b"a", b"b"])
    assert stub.batches == [b"a", b"b"]
    assert said == [
        "keystrokes were lost: CreateOS write process input failed: HTTP 409 (conflicting state)."
    ]
    assert ended is None


@pytest.mark.parametrize(
    ("error", "exited"),
    [(NotFound("write process input", 404), False), (Conflict("write process input", 409), True)],
)
@pytest.mark.anyio
async def test_input_refused_by_an_exiting_shell_waits_for_its_exit(
    monkeypatch: pytest.MonkeyPatch, error: CreateOSError, exited: bool
) -> None:
    monkeypatch.setattr(session, "INPUT_GONE_SECONDS", 0.1)
    stub = _RefusingInput([error], exited=exited)
    said, ended = await _feed(stub, [b"a"])
    assert stub.batches == [b"a"] and said == []
    assert ended == Ended(1, "the remote shell stopped taking input")
