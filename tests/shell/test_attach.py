"""``python -m provider shell`` on a real pseudo-terminal against the emulator (checklist 82, the
helper's half): typing, the terminal size and its changes, the exit code, hang-ups, cleanup."""

from __future__ import annotations

import os
import signal
import termios
from pathlib import Path
from typing import Any

import anyio
import pytest

from provider.emulator import Emulator
from tests.emulator.helpers import KEY, api, create_sandbox, wait_status
from tests.waiting import wait_until

from .local_pty import LocalTerminal, helper_env, local_terminal

pytestmark = pytest.mark.anyio

PROMPT = rb"bash-[0-9.]+# "


async def running_sandbox(emulator: Emulator) -> str:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        await wait_status(client, sandbox_id, "running")
    return sandbox_id


async def process_rows(emulator: Emulator, sandbox_id: str) -> list[dict[str, Any]]:
    return [p for p in (await emulator.admin.state())["processes"] if p["sandbox_id"] == sandbox_id]


def foreground_commands(emulator: Emulator) -> list[str]:
    """The command in the foreground of each of the emulator's PTYs, as the guest sees it."""
    assert emulator.core is not None
    jobs = [process.foreground() for _, process in emulator.core.processes.values()]
    return [job["cmd"] for job in jobs if job is not None]


async def requests_since(emulator: Emulator, seq: int) -> list[dict[str, Any]]:
    return [r for r in await emulator.admin.requests() if r["seq"] > seq]


async def last_seq(emulator: Emulator) -> int:
    log = await emulator.admin.requests()
    return int(log[-1]["seq"]) if log else 0


async def assert_no_process_left(emulator: Emulator, sandbox_id: str, since: int) -> None:
    rows = await process_rows(emulator, sandbox_id)
    assert rows, "the helper started no process"
    assert [p for p in rows if p["tree_alive"]] == []
    deletes = [
        r
        for r in await requests_since(emulator, since)
        if r["method"] == "DELETE" and "/processes/" in r["path"]
    ]
    assert len(deletes) == 1 and deletes[0]["query"] == "grace_ms=1000", deletes
    assert deletes[0]["status"] == 200


async def connect(term: LocalTerminal) -> int:
    """Wait for the status line and the remote prompt; answers where the prompt ends."""
    start = await term.expect(rb"provider shell: connected to sandbox ")
    return await term.expect(PROMPT, start)


async def test_types_in_the_sandbox_follows_resizes_and_exits_with_the_remote_code(
    emulator: Emulator, tmp_path: Path
) -> None:
    sandbox_id = await running_sandbox(emulator)
    since = await last_seq(emulator)
    env = helper_env(tmp_path, KEY)
    args = ["--api-url", emulator.base_url + "/v1/", sandbox_id]
    async with local_terminal(args, env, rows=33, cols=111) as term:
        at = await connect(term)
        raw = term.attrs()
        assert raw != term.cooked  # the helper put the local terminal in raw mode
        assert not raw[3] & (termios.ECHO | termios.ICANON)

        term.type(b"echo hello > /paperclip-workspace/setup.txt\r")
        at = await term.expect(rb"echo hello > /paperclip-workspace/setup.txt\r\n", at)
        at = await term.expect(PROMPT, at)
        term.type(b"stty size\r")
        at = await term.expect(rb"stty size\r\n", at)
        at = await term.expect(rb"[\r\n]33 111\r\n", at)
        at = await term.expect(PROMPT, at)

        before_resize = await last_seq(emulator)
        term.resize(20, 90)
        with anyio.fail_after(20):
            while not [
                r
                for r in await requests_since(emulator, before_resize)
                if r["method"] == "POST" and r["path"].endswith("/resize")
            ]:
                await anyio.sleep(0.05)
        term.type(b"stty size\r")
        at = await term.expect(rb"stty size\r\n", at)
        at = await term.expect(rb"[\r\n]20 90\r\n", at)
        at = await term.expect(PROMPT, at)

        term.type(b"exit 3\r")
        assert await term.wait() == 3
        await term.expect(rb"provider shell: disconnected: the remote shell exited with code 3")
        assert term.attrs() == term.cooked  # restored
        assert KEY.encode() not in term.output

    async with api(emulator) as client:
        got = await client.get(
            f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/paperclip-workspace/setup.txt"}
        )
    assert got.status_code == 200 and got.content == b"hello\n"
    await assert_no_process_left(emulator, sandbox_id, since)
    log = await requests_since(emulator, since)
    created = [r for r in log if r["method"] == "POST" and r["path"].endswith("/processes")]
    assert len(created) == 1 and created[0]["status"] == 200
    resizes = [r for r in log if r["path"].endswith("/resize")]
    assert [r["status"] for r in resizes] == [200]
    assert all(r["auth"] == "ok" for r in log)


@pytest.mark.parametrize("how", ["close", "SIGHUP", "SIGTERM"])
async def test_a_local_hang_up_deletes_the_remote_shell(
    emulator: Emulator, tmp_path: Path, how: str
) -> None:
    sandbox_id = await running_sandbox(emulator)
    since = await last_seq(emulator)
    args = ["--api-url", emulator.base_url, sandbox_id]
    async with local_terminal(args, helper_env(tmp_path, KEY), rows=24, cols=80) as term:
        at = await connect(term)
        term.type(b"sleep 1000\r")
        await term.expect(rb"sleep 1000\r\n", at)
        await wait_until(lambda: foreground_commands(emulator) == ["sleep"])  # runs remotely
        alive = [p for p in await process_rows(emulator, sandbox_id) if p["tree_alive"]]
        assert len(alive) == 1
        if how == "close":
            term.hang_up()
            code = await term.wait()
            assert code in (1, 128 + signal.SIGHUP)  # EIO on stdin or SIGHUP, whichever first
        else:
            os.kill(term.proc.pid, signal.Signals[how])
            code = await term.wait()
            assert code == 128 + signal.Signals[how]
            await term.expect(rb"disconnected: " + how.encode() + rb" received")
            assert term.attrs() == term.cooked  # restored on this way out too
    await assert_no_process_left(emulator, sandbox_id, since)


async def test_an_unknown_sandbox_is_reported_and_nothing_is_left(
    emulator: Emulator, tmp_path: Path
) -> None:
    args = ["--api-url", emulator.base_url, "sb_does_not_exist"]
    async with local_terminal(args, helper_env(tmp_path, KEY), rows=24, cols=80) as term:
        assert await term.wait() == 1
        await term.expect(rb"could not open a shell: .*404.*does not exist or belongs to another")
        assert term.attrs() == term.cooked
    assert (await emulator.admin.state())["processes"] == []


async def test_a_hang_up_during_the_create_still_deletes_the_new_shell(
    emulator: Emulator, tmp_path: Path
) -> None:
    sandbox_id = await running_sandbox(emulator)
    since = await last_seq(emulator)
    await emulator.admin.add_fault("POST", r"/processes$", delay_ms=1500)
    core = emulator.core
    assert core is not None
    args = ["--api-url", emulator.base_url, sandbox_id]
    async with local_terminal(args, helper_env(tmp_path, KEY), rows=24, cols=80) as term:
        with anyio.fail_after(30):  # the create request has reached the emulator
            while any(f.times for f in core.faults):
                await anyio.sleep(0.01)
        os.kill(term.proc.pid, signal.SIGTERM)
        assert await term.wait() == 128 + signal.SIGTERM
        assert b"connected to sandbox" not in term.output
        await term.expect(rb"disconnected: SIGTERM received")
        assert term.attrs() == term.cooked
    await assert_no_process_left(emulator, sandbox_id, since)
