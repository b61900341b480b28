"""A silent ``connect`` (no heartbeats) on a real HTTP server: a silent command is followed to
its exit without spending the reconnect budget; a stream that misses output is still dropped."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from provider.createos.client import CreateOSClient
from provider.createos.errors import ReconnectBudgetExhausted
from provider.createos.models import DataFrame, ExitFrame
from provider.createos.pacer import RequestPacer
from provider.createos.stream import follow_process_output
from tests.createos.scripts import PROC, SB, ok, process

pytestmark = pytest.mark.anyio
CONNECT = f"/v1/sandboxes/{SB}/processes/{PROC}/connect"
READ = f"/v1/sandboxes/{SB}/processes/{PROC}"
END = (
    json.dumps({"type": "data", "seq": 1, "stream": "stdout", "data_base64": "ZG9uZQ=="})
    + "\n"
    + json.dumps({"type": "exit", "exit_code": 0})
    + "\n"
).encode()


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    """Threaded: a silent stream's handler must not hold up the process reads."""
    http = HTTPServer(threaded=True)
    http.start()
    try:
        yield http
    finally:
        http.clear()
        if http.is_running():
            http.stop()


@pytest.fixture
async def api(server: HTTPServer) -> AsyncIterator[CreateOSClient]:
    origin = server.url_for("/").rstrip("/")
    async with CreateOSClient(origin, "key", pacer=RequestPacer(origin, interval=0)) as client:
        yield client


class SilentCommand:
    """``connect`` sends its head, then nothing until ``released`` (the command's first output)."""

    def __init__(self, *, release_after_reads: int | None, newest_seq: int = 0) -> None:
        self.released = threading.Event()
        self.release_after_reads = release_after_reads
        self.newest_seq = newest_seq
        self.connects = 0
        self.reads = 0

    def connect(self, request: Request) -> Response:
        self.connects += 1

        def body() -> Iterator[bytes]:
            yield b""  # the response head goes out; the body stays silent
            if self.released.wait(timeout=60):
                yield END

        return Response(body(), content_type="application/x-ndjson")

    def read(self, request: Request) -> Response:
        self.reads += 1
        if self.reads == self.release_after_reads:
            self.released.set()
        view: dict[str, Any] = process(output={"newest_seq": self.newest_seq})
        return ok({**view, "process_id": PROC})


def serve(server: HTTPServer, command: SilentCommand) -> None:
    server.expect_request(CONNECT).respond_with_handler(command.connect)
    server.expect_request(READ, method="GET").respond_with_handler(command.read)


async def test_a_silent_command_is_followed_to_its_exit_without_spending_reconnects(
    server: HTTPServer, api: CreateOSClient
) -> None:
    command = SilentCommand(release_after_reads=6)  # six silences: more than the budget of 3
    serve(server, command)

    frames = [
        f
        async for f in follow_process_output(
            api, SB, PROC, silence_limit=0.3, max_reconnects=3, reconnect_delay=0
        )
    ]

    assert frames == [DataFrame(1, "stdout", b"done"), ExitFrame(0, None)]
    assert command.reads == 6
    assert command.connects == 7  # one per silence, plus the one that saw the exit
    command.released.set()


async def test_a_silent_stream_that_missed_output_counts_against_the_budget(
    server: HTTPServer, api: CreateOSClient
) -> None:
    command = SilentCommand(release_after_reads=None, newest_seq=5)  # output the stream lost
    serve(server, command)

    with pytest.raises(ReconnectBudgetExhausted, match="4 connection attempts"):
        async for _ in follow_process_output(
            api, SB, PROC, silence_limit=0.3, max_reconnects=3, reconnect_delay=0
        ):
            pass

    assert command.connects == 4
    assert command.reads == 4
    command.released.set()


@pytest.mark.slow
@pytest.mark.timeout(180)  # 45 s of silence by design
async def test_a_45_s_silent_connect_completes_with_the_default_limits(
    server: HTTPServer, api: CreateOSClient
) -> None:
    """Production defaults: 45 s without a byte costs no reconnect and no process read."""
    command = SilentCommand(release_after_reads=None)
    serve(server, command)
    timer = threading.Timer(45.0, command.released.set)  # the command's first output
    timer.start()
    try:
        frames = [f async for f in follow_process_output(api, SB, PROC)]
    finally:
        timer.cancel()

    assert frames[-1] == ExitFrame(0, None)
    assert (command.connects, command.reads) == (1, 0)
