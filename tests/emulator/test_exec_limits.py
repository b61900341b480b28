"""What bounds the exec call: the "older server" switch (no streamed exec: 404 as an unknown
route, the buffered exec still served) and the largest exec JSON body (``max_exec_body_bytes``,
4 MiB: 1 MiB of stdin inline plus the wrapper script fits even JSON-escaped).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from provider.emulator import Emulator
from provider.emulator.settings import Settings

from .helpers import api, create_sandbox, data

pytestmark = pytest.mark.anyio

MIB = 1 << 20
Box = tuple[httpx.AsyncClient, str]


@pytest.fixture
async def box(emulator: Emulator) -> AsyncIterator[Box]:
    async with api(emulator) as client:
        yield client, await create_sandbox(client)


async def test_an_older_server_answers_the_streamed_exec_as_an_unknown_route(
    emulator: Emulator, box: Box
) -> None:
    client, sandbox_id = box
    unknown = await client.post(f"/v1/sandboxes/{sandbox_id}/no-such-call", json={})
    await emulator.admin.settings(exec_stream=False)
    url = f"/v1/sandboxes/{sandbox_id}/exec"
    body = {"cmd": "/bin/bash", "args": ["-c", "touch /tmp/ran"]}
    by_query = await client.post(url, params={"stream": "true"}, json=body)
    by_body = await client.post(url, json={**body, "stream": True})
    for answer in (by_query, by_body):
        assert (answer.status_code, answer.json()) == (404, unknown.json())
    buffered = await client.post(url, json={"cmd": "/bin/ls", "args": ["/tmp/ran"]})
    assert data(buffered)["result"]["exit_code"] != 0  # served, and nothing ran before it
    await emulator.admin.settings(exec_stream=True)
    again = await client.post(url, params={"stream": "true"}, json={"cmd": "/bin/true"})
    assert [json.loads(line) for line in again.text.splitlines()] == [{"exit_code": 0}]


def test_the_exec_stream_is_on_and_the_exec_body_limit_4_mib_by_default() -> None:
    assert Settings().exec_stream is True
    assert Settings().max_exec_body_bytes == 4 * MIB


def body_of_size(size: int, stream: bool) -> tuple[bytes, int]:
    """An exec of ``wc -c`` whose JSON body is exactly ``size`` bytes (stdin pads it), and the
    size of that stdin."""
    head = {"cmd": "/usr/bin/wc", "args": ["-c"], "stream": stream, "stdin": ""}
    stdin_size = size - len(json.dumps(head).encode())
    encoded = json.dumps({**head, "stdin": "x" * stdin_size}).encode()
    assert len(encoded) == size
    return encoded, stdin_size


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
async def test_the_largest_accepted_exec_body_is_max_exec_body_bytes(
    box: Box, stream: bool
) -> None:
    client, sandbox_id = box
    url = f"/v1/sandboxes/{sandbox_id}/exec"
    limit = Settings().max_exec_body_bytes
    headers = {"Content-Type": "application/json"}
    body, stdin_size = body_of_size(limit, stream)
    largest = await client.post(url, content=body, headers=headers)
    assert largest.status_code == 200
    if stream:
        frames = [json.loads(line) for line in largest.text.splitlines()]
        assert frames == [{"stdout": f"{stdin_size}\n"}, {"exit_code": 0}]
    else:
        assert data(largest)["result"]["stdout"] == f"{stdin_size}\n"
    over = await client.post(url, content=body_of_size(limit + 1, stream)[0], headers=headers)
    assert over.status_code == 413
    assert over.json() == {
        "status": "fail",
        "data": {"body": f"request body exceeds {limit} bytes"},
    }


async def test_the_exec_body_limit_is_a_setting(emulator: Emulator, box: Box) -> None:
    client, sandbox_id = box
    await emulator.admin.settings(max_exec_body_bytes=MIB)
    url = f"/v1/sandboxes/{sandbox_id}/exec"
    headers = {"Content-Type": "application/json"}
    fits = await client.post(url, content=body_of_size(MIB, False)[0], headers=headers)
    assert fits.status_code == 200
    over = await client.post(url, content=body_of_size(MIB + 1, False)[0], headers=headers)
    assert over.status_code == 413
