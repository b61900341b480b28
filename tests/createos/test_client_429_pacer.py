"""A 429 from the API reaches the origin's pacer (docs/protocol.md 4)."""

from __future__ import annotations

import anyio
import httpx
import pytest

from provider.createos.client import CreateOSClient
from provider.createos.errors import RateLimited
from provider.createos.pacer import RequestPacer

ORIGIN = "http://127.0.0.1:8790"


class RecordingPacer(RequestPacer):
    def __init__(self) -> None:
        super().__init__(ORIGIN, interval=0)
        self.penalties: list[float | None] = []

    async def penalize(self, retry_after: float | None = None) -> None:
        self.penalties.append(retry_after)


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_a_429_penalizes_the_pacer_with_its_retry_after(stream: bool) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "90"})  # past the deadline below

    pacer = RecordingPacer()
    async with CreateOSClient(
        ORIGIN, "key", pacer=pacer, transport=httpx.MockTransport(handler)
    ) as client:
        with anyio.fail_after(30), pytest.raises(RateLimited):
            if stream:
                async with client.connect("sb-1", "p-1", after=0):
                    pass
            else:
                await client.get_sandbox("sb-1")
    assert pacer.penalties == [90.0]
