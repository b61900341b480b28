"""Commands named by a token, as the worker's streamed-exec path names them (docs/protocol.md
3.9): a token in a process's environment is visible in ``/proc/<pid>/environ`` to every other
exec of the sandbox, as on a real VM, whatever the process did (``setsid``, a double fork), and
such processes can be killed from there; ``/proc/<pid>/stat`` field 52 gives a zombie child's
raw wait status; orphans are reaped; and every fault action applies to an exec stream, a cut
stream leaving its command running where a later exec finds it by its token.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

from provider.emulator import Emulator

from .helpers import LOST_STREAM_LEAK, api, create_sandbox, data, sh

pytestmark = pytest.mark.anyio

GATE = "until [ -e /tmp/go ]; do sleep 0.02; done"


def scan(token: str) -> str:
    """A script printing the guest pid of every process whose environment holds the token."""
    return (
        "for e in /proc/[0-9]*/environ; do "
        f"if tr '\\0' '\\n' < \"$e\" 2>/dev/null | grep -qx 'PAPERCLIP_CMD={token}'; then "
        'p=${e#/proc/}; echo "${p%/environ}"; fi; done'
    )


async def token_pids(client: httpx.AsyncClient, sandbox_id: str, token: str) -> set[str]:
    return set((await sh(client, sandbox_id, scan(token)))["stdout"].split())


async def wait_token_pids(
    client: httpx.AsyncClient, sandbox_id: str, token: str, count: int
) -> set[str]:
    """Scan until ``count`` processes carry the token (a program in its first microseconds,
    before its ``execve``, may not carry it yet)."""
    with anyio.fail_after(10):
        while len(found := await token_pids(client, sandbox_id, token)) < count:
            await anyio.sleep(0.02)
    return found


async def kill_and_confirm(client: httpx.AsyncClient, sandbox_id: str, token: str) -> None:
    """What the worker's kill exec does: SIGKILL every holder, then scan until none is left."""
    script = (
        f"kill -KILL $({scan(token)}) 2>/dev/null; "
        f'for i in $(seq 500); do [ -z "$({scan(token)})" ] && exit 0; sleep 0.02; done; exit 1'
    )
    result = await sh(client, sandbox_id, script)
    assert result["exit_code"] == 0, result
    assert await token_pids(client, sandbox_id, token) == set()


def tokened(token: str, script: str) -> dict[str, Any]:
    """The exec body of the worker's wrapper: ``env`` puts the token, then bash runs."""
    return {"cmd": "/usr/bin/env", "args": [f"PAPERCLIP_CMD={token}", "/bin/bash", "-c", script]}


@asynccontextmanager
async def streaming(
    client: httpx.AsyncClient, sandbox_id: str, body: dict[str, Any]
) -> AsyncIterator[AsyncIterator[str]]:
    url = f"/v1/sandboxes/{sandbox_id}/exec"
    with anyio.fail_after(20):
        async with client.stream("POST", url, params={"stream": "true"}, json=body) as response:
            assert response.status_code == 200
            yield response.aiter_lines()


@pytest.fixture
async def box(emulator: Emulator) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    async with api(emulator) as client:
        yield client, await create_sandbox(client)


async def test_setsid_and_double_forked_children_keep_the_token_and_die_by_it(
    box: tuple[httpx.AsyncClient, str],
) -> None:
    client, sandbox_id = box
    token = secrets.token_hex(16)
    script = (
        "setsid bash -c 'echo $$ > /tmp/setsid.pid; exec sleep 300' & "
        "( bash -c 'echo $$ > /tmp/double.pid; exec sleep 300' & ) ; "
        "until [ -s /tmp/setsid.pid ] && [ -s /tmp/double.pid ]; do sleep 0.02; done; "
        "echo $$; exec sleep 300"
    )
    async with streaming(client, sandbox_id, tokened(token, script)) as lines:
        leader = json.loads(await anext(lines))["stdout"].strip()
        others = await sh(client, sandbox_id, "cat /tmp/setsid.pid /tmp/double.pid")
        setsid_pid, double_pid = others["stdout"].split()
        session = await sh(client, sandbox_id, f"ps -o sid= -p {setsid_pid}")
        assert session["stdout"].strip() == setsid_pid  # a session of its own
        # The holders and nothing else (not the reaper, not the scanning exec).
        assert await token_pids(client, sandbox_id, token) == {leader, setsid_pid, double_pid}
        await kill_and_confirm(client, sandbox_id, token)
        # Every holder of the stream's stdout is gone: the stream ends, with the leader's fate.
        frames = [json.loads(line) async for line in lines if line]
    assert frames[-1] == {"exit_code": 137}


async def test_a_managed_processs_token_is_seen_and_killed_from_an_exec(
    box: tuple[httpx.AsyncClient, str],
) -> None:
    client, sandbox_id = box
    token = secrets.token_hex(16)
    body = tokened(token, "( setsid sleep 300 & ) ; exec sleep 300")
    created = await client.post(f"/v1/sandboxes/{sandbox_id}/processes", json=body)
    process_id = data(created)["process_id"]
    assert len(await wait_token_pids(client, sandbox_id, token, 2)) == 2
    await kill_and_confirm(client, sandbox_id, token)
    url = f"/v1/sandboxes/{sandbox_id}/processes/{process_id}/wait"
    ended = data(await client.get(url, params={"scope": "tree"}))
    assert (ended["signal"], ended["tree_exited"]) == ("SIGKILL", True)


@pytest.mark.parametrize(("end", "status"), [("exit 7", 7 << 8), ("kill -TERM $$", 15)])
async def test_a_zombie_childs_wait_status_is_in_stat_field_52_until_its_parent_dies(
    box: tuple[httpx.AsyncClient, str], end: str, status: int
) -> None:
    # The wrapper's trick: the command's leader is a child of an `exec sleep` holder, which
    # never reaps, so its raw wait status stays readable; once the holder dies, the orphaned
    # zombie is reaped (by the command's reaper) and disappears.
    client, sandbox_id = box
    script = f"bash -c '{GATE}; {end}' & echo $! $$; exec sleep 300"
    async with streaming(client, sandbox_id, {"cmd": "/bin/bash", "args": ["-c", script]}) as out:
        child, holder = json.loads(await anext(out))["stdout"].split()
        read_status = (
            f"until grep -q '^{child} (bash) Z' /proc/{child}/stat; do sleep 0.02; done; "
            f"s=$(cat /proc/{child}/stat); set -- ${{s##*) }}; echo ${{50}}"
        )
        result = await sh(client, sandbox_id, f"touch /tmp/go; {read_status}")
        assert result["stdout"] == f"{status}\n"
        gone = f"kill {holder}; while [ -e /proc/{child} ]; do sleep 0.02; done; echo reaped"
        assert (await sh(client, sandbox_id, gone))["stdout"] == "reaped\n"


FAULTS: list[
    tuple[dict[str, Any], bool]
] = [  # (action, performed): a performed request's command runs on after the stream
    ({"cut_after_frames": 1}, True),
    ({"cut_after_bytes": 5}, True),
    ({"lose_response": True}, True),
    ({"drop": True}, False),
    ({"status": 503}, False),
]


@LOST_STREAM_LEAK
@pytest.mark.parametrize(("action", "performed"), FAULTS, ids=[next(iter(a)) for a, _ in FAULTS])
async def test_every_fault_applies_to_an_exec_stream_and_a_cut_one_leaves_its_command_running(
    emulator: Emulator, box: tuple[httpx.AsyncClient, str], action: dict[str, Any], performed: bool
) -> None:
    client, sandbox_id = box
    token = secrets.token_hex(16)
    await emulator.admin.add_fault("POST", r"/exec$", **action)
    body = tokened(token, "echo started; touch /tmp/ran; exec sleep 300")
    lines: list[str] = []
    if "status" in action:
        answer = await client.post(f"/v1/sandboxes/{sandbox_id}/exec?stream=true", json=body)
        assert answer.status_code == 503
    else:
        with pytest.raises(httpx.RemoteProtocolError):
            async with streaming(client, sandbox_id, body) as stream:
                lines += [line async for line in stream]
    assert not any("exit_code" in line for line in lines)  # the stream never completed
    if performed:  # found by its token (once past env's own exec), and killed
        assert len(await wait_token_pids(client, sandbox_id, token, 1)) == 1
        await kill_and_confirm(client, sandbox_id, token)
    else:
        assert (await sh(client, sandbox_id, "ls /tmp/ran"))["exit_code"] != 0
        assert await token_pids(client, sandbox_id, token) == set()
