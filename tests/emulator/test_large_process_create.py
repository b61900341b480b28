"""Process creates up to the request body limit (1 MiB) start, or get a truthful refusal.

The emulator handed each spawn to the guest supervisor as one SOCK_SEQPACKET message, which the
socket's send buffer limits (about 208 KiB by default): a create carrying more argv than that
was answered ``409 sandbox is no longer running`` though the sandbox ran on. Such a request now
travels in a memfd, so the kernel's own argv limits decide, as on a real machine: each argv
string at most 128 KiB (MAX_ARG_STRLEN, an execve E2BIG answered as a 400).
"""

from __future__ import annotations

import pytest

from provider.emulator import Emulator

from .helpers import api, create_sandbox, data, payload, read_frames, sh

pytestmark = pytest.mark.anyio

COUNT_ARGS = 'printf "%s %s" "$#" "${#1}"'
ARG = "x" * 100_000  # under MAX_ARG_STRLEN (131,072 bytes with its NUL)


async def test_large_creates_start_up_to_the_body_limit(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        url = f"/v1/sandboxes/{sandbox_id}/processes"
        for count in (2, 3, 6, 10):  # 0.2 to 1 MiB of argv (the body limit is 1 MiB)
            args = ["-c", COUNT_ARGS, "argv0", *[ARG] * count]
            response = await client.post(url, json={"cmd": "/bin/bash", "args": args})
            assert response.status_code == 200, (count, response.text)
            frames = await read_frames(client, sandbox_id, data(response)["process_id"])
            assert payload(frames, "stdout") == f"{count} 100000".encode()
        # One argv string over MAX_ARG_STRLEN: refused as the kernel refuses it, not as "gone".
        too_long = ["-c", COUNT_ARGS, "argv0", "x" * 300_000]
        response = await client.post(url, json={"cmd": "/bin/bash", "args": too_long})
        assert response.status_code == 400, response.text
        assert "Argument list too long" in response.text
        # Past the body limit: 413, before anything is spawned.
        response = await client.post(url, json={"cmd": "/bin/bash", "args": [ARG] * 11})
        assert response.status_code == 413, response.text
        assert (await sh(client, sandbox_id, "echo still running"))["stdout"] == "still running\n"
