"""Helpers for login-terminal and duplex-channel tests on the driver harness."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import anyio

from devtools.call_params import route_params
from provider.replies import AfterReply
from tests.driver.conftest import Harness


def open_params(h: Harness, lease: dict[str, Any], route: str, **extra: Any) -> dict[str, Any]:
    return route_params(h.call(), lease, route, **extra)


async def answered(reply: Any) -> dict[str, Any]:
    """What the dispatcher does with an open's answer: write it, then tell the session."""
    assert isinstance(reply, AfterReply)
    result = dict(reply.result)
    reply.written(True)
    return result


async def open_channel(
    h: Harness, lease: dict[str, Any], command: list[str], route: str = "duplex-route-1"
) -> str:
    reply = await h.methods.channel_open(open_params(h, lease, route, command=command))
    result = await answered(reply)
    assert result["hostRouteId"] == route
    session_id = result["workerSessionId"]
    assert isinstance(session_id, str) and session_id.startswith("duplex-")
    return session_id


async def write(h: Harness, route: str, session_id: str, data: bytes) -> None:
    await h.methods.channel_write(
        {
            "hostRouteId": route,
            "workerSessionId": session_id,
            "data": base64.b64encode(data).decode(),
        }
    )


def notes(h: Harness, method: str, route: str | None = None) -> list[dict[str, Any]]:
    return [
        params
        for name, params in h.notifications
        if name == method and (route is None or params.get("hostRouteId") == route)
    ]


def channel_bytes(h: Harness, route: str) -> bytes:
    return b"".join(
        base64.b64decode(p["chunk"], validate=True) for p in notes(h, "duplexChannel.data", route)
    )


async def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.02)


def names(h: Harness) -> list[str]:
    return [name for name, _ in h.notifications]
