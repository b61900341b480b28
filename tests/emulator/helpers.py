"""Small HTTP helpers shared by the emulator tests (plain httpx against the real server)."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from anyio.abc import SocketAttribute

from provider.emulator import Emulator
from provider.emulator.usernet import HOST, HOST_ADDRESS, USER_MODE, find_slirp4netns

# The network mode of an allow-all sandbox on this host (see provider/emulator/usernet.py).
OPEN_NETWORK = USER_MODE if find_slirp4netns() is not None else HOST
KEY = "test-key"
OTHER_KEY = "other-key"

#: A known emulator leak, left to its owner: an exec-stream response lost on purpose (the
#: lose_response fault) is discarded with aclose() on its never-started frame relay, which so
#: never closes the receive stream it was handed (provider/emulator/exec_stream.py). Tests that
#: lose such a response carry this filter; remove it with that fix.
LOST_STREAM_LEAK = pytest.mark.filterwarnings(
    "ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning"
)


@asynccontextmanager
async def api(emu: Emulator, key: str | None = KEY) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"X-Api-Key": key} if key is not None else {}
    async with httpx.AsyncClient(
        base_url=emu.base_url, headers=headers, timeout=30.0, follow_redirects=False
    ) as client:
        yield client


def data(response: httpx.Response) -> Any:
    body = response.json()
    assert body["status"] == "success", body
    return body["data"]


async def create_sandbox(client: httpx.AsyncClient, **fields: Any) -> str:
    body = {"shape": "s-1vcpu-1gb", **fields}
    response = await client.post("/v1/sandboxes", json=body)
    assert response.status_code == 200, response.text
    return str(data(response)["id"])


async def wait_status(client: httpx.AsyncClient, sandbox_id: str, status: str) -> dict[str, Any]:
    with anyio.fail_after(20):
        while True:
            response = await client.get(f"/v1/sandboxes/{sandbox_id}")
            if response.status_code == 200 and data(response)["status"] == status:
                return dict(data(response))
            await anyio.sleep(0.02)


async def admin_status(emu: Emulator, sandbox_id: str) -> str | None:
    """The sandbox's status read through the admin API (never sandbox activity); None when it
    is no longer live."""
    for row in (await emu.admin.state())["sandboxes"]:
        if row["id"] == sandbox_id:
            return str(row["status"])
    return None


async def wait_status_quietly(
    emu: Emulator, sandbox_id: str, status: str, timeout: float = 20.0
) -> float:
    """Wait for ``status`` without touching the sandbox's idle clock (admin reads only);
    answers the seconds waited."""
    started = anyio.current_time()
    with anyio.fail_after(timeout):
        while await admin_status(emu, sandbox_id) != status:
            await anyio.sleep(0.05)
    return anyio.current_time() - started


async def sh(client: httpx.AsyncClient, sandbox_id: str, script: str) -> dict[str, Any]:
    """Buffered exec of ``bash -c script``; returns the ``result`` object."""
    response = await client.post(
        f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "/bin/bash", "args": ["-c", script]}
    )
    assert response.status_code == 200, response.text
    return dict(data(response)["result"])


async def start_process(
    client: httpx.AsyncClient, sandbox_id: str, script: str, **fields: Any
) -> dict[str, Any]:
    response = await client.post(
        f"/v1/sandboxes/{sandbox_id}/processes",
        json={"cmd": "/bin/bash", "args": ["-c", script], **fields},
    )
    assert response.status_code == 200, response.text
    return dict(data(response))


async def read_frames(
    client: httpx.AsyncClient, sandbox_id: str, process_id: str, after: int = 0
) -> list[dict[str, Any]]:
    """Every frame of one connect, until the server ends the stream."""
    frames = []
    path = f"/v1/sandboxes/{sandbox_id}/processes/{process_id}/connect"
    async with client.stream("GET", path, params={"after": after}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        async for line in response.aiter_lines():
            if line:
                frames.append(json.loads(line))
    return frames


def payload(frames: list[dict[str, Any]], stream: str | None = None) -> bytes:
    return b"".join(
        base64.b64decode(f["data_base64"])
        for f in frames
        if f["type"] == "data" and (stream is None or f["stream"] == stream)
    )


async def guest_pids(client: httpx.AsyncClient, sandbox_id: str) -> set[str]:
    result = await sh(client, sandbox_id, "ls /proc | grep -E '^[0-9]+$'")
    return set(result["stdout"].split())


@asynccontextmanager
async def host_listener() -> AsyncIterator[int]:
    """A TCP listener on the host's 127.0.0.1 (ephemeral port, yielded) that greets every
    connection with ``hello``."""

    async def greet(stream: anyio.abc.SocketStream) -> None:
        with contextlib.suppress(Exception):
            async with stream:
                await stream.send(b"hello\n")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = int(listener.extra(SocketAttribute.local_port))
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, greet)
        try:
            yield port
        finally:
            tg.cancel_scope.cancel()


async def reaches_host(client: httpx.AsyncClient, sandbox_id: str, port: int) -> bool:
    """Whether the sandbox can open a TCP connection to the host's ``127.0.0.1:port`` (and
    read the listener's greeting): at 10.0.2.2 from a user-mode sandbox, at 127.0.0.1 from one
    on the host network (the first answer that greets wins)."""
    script = (
        f"for address in {HOST_ADDRESS} 127.0.0.1; do timeout 5 bash -c "
        f"'exec 3<>/dev/tcp/'$address'/{port} && read -r line <&3 && "
        'echo "got $line"\' 2>/dev/null && break; done'
    )
    result = await sh(client, sandbox_id, script)
    return bool(result["stdout"] == "got hello\n")


async def network_mode(emu: Emulator, sandbox_id: str) -> str:
    """``user-mode``, ``loopback-only`` or ``host``, as the admin state reports it."""
    for row in (await emu.admin.state())["sandboxes"]:
        if row["id"] == sandbox_id:
            return str(row["network"])
    raise AssertionError(f"{sandbox_id} is not live")
