"""Opening a download is retried like any GET (docs/protocol.md C1.8); a cut body is not."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Response

from provider.createos.client import CreateOSClient
from provider.createos.errors import APIConnectionError, NotFound, ServerError
from tests.createos.conftest import API_KEY, CountingPacer

pytestmark = pytest.mark.anyio

SB = "sb_01J8ZABCDEFGHJKMNPQRSTVWXY"
URL = f"/v1/sandboxes/{SB}/files"


def status(code: int, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps({"status": "error", "message": "busy", "code": code})
    return Response(body, status=code, content_type="application/json", headers=headers)


async def read_all(client: CreateOSClient) -> bytes:
    received = bytearray()
    async with client.get_file(SB, "/tmp/blob") as body:
        async for chunk in body:
            received += chunk
    return bytes(received)


@pytest.mark.parametrize("code", [429, 500, 502, 503, 504])
async def test_a_transient_status_at_open_is_retried(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float], code: int
) -> None:
    httpserver.expect_ordered_request(URL).respond_with_response(status(code))
    httpserver.expect_ordered_request(URL).respond_with_data(b"payload")

    assert await read_all(client) == b"payload"
    assert len(httpserver.log) == 2 and len(delays) == 1


async def test_retry_after_is_honoured_when_opening(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float]
) -> None:
    httpserver.expect_ordered_request(URL).respond_with_response(status(429, {"Retry-After": "7"}))
    httpserver.expect_ordered_request(URL).respond_with_data(b"x")

    assert await read_all(client) == b"x"
    assert delays == [7.0]


async def test_opening_gives_up_after_two_retries(
    httpserver: HTTPServer, client: CreateOSClient, pacer: CountingPacer, delays: list[float]
) -> None:
    httpserver.expect_request(URL).respond_with_response(status(503))

    with pytest.raises(ServerError):
        await read_all(client)
    assert len(httpserver.log) == 3 and pacer.turns == 3


async def test_a_404_is_raised_at_once(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float]
) -> None:
    httpserver.expect_request(URL).respond_with_response(status(404))

    with pytest.raises(NotFound):
        await read_all(client)
    assert len(httpserver.log) == 1 and delays == []


async def test_a_body_cut_after_it_started_is_not_retried(delays: list[float]) -> None:
    calls = 0

    class CutStream(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b"pa"
            raise httpx.RemoteProtocolError("peer closed connection mid-body")

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(200, stream=CutStream())

    origin = "http://127.0.0.1:9"
    async with CreateOSClient(
        origin, API_KEY, pacer=CountingPacer(origin), transport=httpx.MockTransport(handler)
    ) as api:
        with pytest.raises(APIConnectionError, match="download file"):
            await read_all(api)
    assert calls == 1 and delays == []


async def test_a_connection_failure_at_open_is_retried(delays: list[float]) -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, content=b"ok")

    origin = "http://127.0.0.1:9"
    async with CreateOSClient(
        origin, API_KEY, pacer=CountingPacer(origin), transport=httpx.MockTransport(handler)
    ) as api:
        assert await read_all(api) == b"ok"
    assert calls == 2 and len(delays) == 1
