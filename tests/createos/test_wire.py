"""Whether a request was sent (provider/createos/core.py, ``Wire``): a call cut while it waits
for the pacer sent nothing; a refused answer leaves nothing sent; other failures leave the
outcome open; ``settle`` lets a request on the wire finish past its caller's cancellation."""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from provider.createos.client import CreateOSClient
from provider.createos.errors import APIConnectionError, RateLimited, ServerError
from provider.createos.pacer import CAPACITY, RequestPacer
from provider.createos.wire import Wire
from tests.createos.conftest import API_KEY
from tests.createos.scripts import SB, fail, ok, process

pytestmark = pytest.mark.anyio
PROCESSES = f"/v1/sandboxes/{SB}/processes"


@pytest.fixture
async def slow_pacer_client(origin: str) -> AsyncIterator[CreateOSClient]:
    """A client whose pacer has no token left and grants the next one in a minute."""
    pacer = RequestPacer(origin, interval=60.0, shared_dir=None)
    for _ in range(CAPACITY):
        await pacer.wait_turn()
    async with CreateOSClient(origin, API_KEY, pacer=pacer, max_retries=0) as api:
        yield api


async def test_a_deadline_in_the_pacer_queue_leaves_the_request_unsent(
    httpserver: HTTPServer, slow_pacer_client: CreateOSClient
) -> None:
    wire = Wire()
    with anyio.move_on_after(0.05):
        await slow_pacer_client.create_process(SB, cmd="/bin/true", args=[], wire=wire)
    assert wire == Wire(sent=False, queued=True)
    assert httpserver.log == []


async def test_a_refused_answer_leaves_it_unsent_and_a_server_error_leaves_it_open(
    httpserver: HTTPServer, origin: str
) -> None:
    httpserver.expect_ordered_request(PROCESSES, method="POST").respond_with_response(fail(429))
    httpserver.expect_ordered_request(PROCESSES, method="POST").respond_with_response(fail(500))
    pacer = RequestPacer(origin, interval=0, shared_dir=None)
    async with CreateOSClient(origin, API_KEY, pacer=pacer, max_retries=0) as api:
        refused, failed = Wire(), Wire()
        with pytest.raises(RateLimited):
            await api.create_process(SB, cmd="/bin/true", args=[], wire=refused)
        with pytest.raises(ServerError):
            await api.create_process(SB, cmd="/bin/true", args=[], wire=failed)
    assert refused.sent is False
    assert failed.sent is True


async def test_settle_lets_a_sent_create_finish_past_its_cancellation(
    httpserver: HTTPServer, origin: str
) -> None:
    received, answer = threading.Event(), threading.Event()

    def handler(request: Request) -> Response:
        received.set()
        answer.wait(30)
        return ok(process())

    httpserver.expect_request(PROCESSES, method="POST").respond_with_handler(handler)
    pacer = RequestPacer(origin, interval=0, shared_dir=None)
    created: list[str] = []
    async with CreateOSClient(origin, API_KEY, pacer=pacer) as api:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:

                async def cancel_once_sent() -> None:
                    await anyio.to_thread.run_sync(received.wait)
                    scope.cancel()
                    answer.set()

                group.start_soon(cancel_once_sent)
                wire = Wire(settle=30.0)
                view = await api.create_process(SB, cmd="/bin/true", args=[], wire=wire)
                created.append(view.process_id)
                await anyio.lowlevel.checkpoint()
                created.append("not reached: the cancellation comes at the next checkpoint")
    assert scope.cancelled_caught
    assert created == [process()["process_id"]]


async def test_a_refused_connection_leaves_it_unsent() -> None:
    with socket.socket() as listener:  # a port nobody listens on: bound, never listening
        listener.bind(("127.0.0.1", 0))
        origin = f"http://127.0.0.1:{listener.getsockname()[1]}"
        pacer = RequestPacer(origin, interval=0, shared_dir=None)
        async with CreateOSClient(origin, API_KEY, pacer=pacer, max_retries=0) as api:
            wire = Wire()
            with pytest.raises(APIConnectionError):
                await api.create_process(SB, cmd="/bin/true", args=[], wire=wire)
    assert wire.sent is False
