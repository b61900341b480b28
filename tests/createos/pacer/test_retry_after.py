"""A long ``Retry-After`` through the real pacer, in virtual time: waited for inside a long
deadline (the pacer's 429 hold included), refused at once inside a short one."""

from __future__ import annotations

import anyio
import httpx
import pytest

from provider.createos.client import CreateOSClient
from provider.createos.errors import RateLimited
from tests.createos.pacer.virtual_time import ORIGIN, virtual_pacer
from tests.createos.scripts import SB

pytestmark = pytest.mark.anyio
VIEW = {"status": "success", "data": {"id": SB, "status": "running"}}


class Script:
    """429 with ``Retry-After: 90`` first, then the view; records each request's virtual time."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.times.append(anyio.current_time())
        if len(self.times) == 1:
            return httpx.Response(429, headers={"Retry-After": "90"})
        return httpx.Response(200, json=VIEW)


async def test_a_retry_after_of_90_s_is_waited_for_inside_a_long_deadline() -> None:
    script, starts = Script(), list[float]()
    pacer = virtual_pacer(None, starts)
    async with CreateOSClient(
        ORIGIN, "key", pacer=pacer, transport=httpx.MockTransport(script)
    ) as api:
        with anyio.fail_after(300):
            view = await api.get_sandbox(SB)

    assert view.status == "running"
    assert len(script.times) == 2
    assert script.times[1] - script.times[0] >= 90.0
    assert len(starts) == 2


async def test_a_retry_after_of_90_s_fails_at_once_inside_a_short_deadline() -> None:
    script = Script()
    async with CreateOSClient(
        ORIGIN, "key", pacer=virtual_pacer(None), transport=httpx.MockTransport(script)
    ) as api:
        began = anyio.current_time()
        with anyio.fail_after(30), pytest.raises(RateLimited, match="retry in 90 s, past"):
            await api.get_sandbox(SB)
        assert anyio.current_time() - began < 1.0  # no sleep into the deadline

    assert len(script.times) == 1
