"""A sandbox whose supervisor died answers every guest operation with one 409.

The router is the one place that turns a lost guest (``GuestGone``) into ``409 {"state":
"sandbox is no longer running"}``: exec (buffered and streamed), both file directions and a
process start all answer it, while the sandbox itself still reads ``running``.
"""

from __future__ import annotations

import os
import signal

import pytest

from provider.emulator import Emulator

from .helpers import api, create_sandbox, data

pytestmark = pytest.mark.anyio

GONE = {"status": "fail", "data": {"state": "sandbox is no longer running"}}


async def test_a_dead_supervisor_is_a_409_on_every_guest_route(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        base = f"/v1/sandboxes/{sandbox_id}"
        put = await client.put(f"{base}/files", params={"path": "/tmp/kept"}, content=b"x")
        assert data(put)["bytes"] == 1
        assert emulator.core is not None
        guest = emulator.core.sandboxes[sandbox_id].guest
        assert guest is not None and guest.host_pid is not None
        os.kill(guest.host_pid, signal.SIGKILL)  # pid 1 of the guest: the namespace goes with it
        command = {"cmd": "/bin/true"}
        answers = {
            "exec": await client.post(f"{base}/exec", json=command),
            "exec stream": await client.post(f"{base}/exec", json={**command, "stream": True}),
            "put": await client.put(f"{base}/files", params={"path": "/tmp/new"}, content=b"y"),
            "get": await client.get(f"{base}/files", params={"path": "/tmp/kept"}),
            "process": await client.post(f"{base}/processes", json=command),
        }
        for name, response in answers.items():
            assert (response.status_code, response.json()) == (409, GONE), name
        assert data(await client.get(base))["status"] == "running"
        assert (await client.delete(base)).status_code in (200, 202)
