"""PTY processes (docs/protocol.md C8.6, checklist 90) and the login PATH's writable
``$HOME/.local/bin`` where tests install fake agent CLIs."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

from provider.emulator import Emulator

from .helpers import api, create_sandbox, data, payload, read_frames, sh, wait_status

pytestmark = pytest.mark.anyio

HOME_BIN = "/root/.local/bin"
FAKE_CODEX = '#!/bin/sh\necho "fake codex $* home=$HOME"\n'


def proc_url(sandbox_id: str, process_id: str, tail: str = "") -> str:
    return f"/v1/sandboxes/{sandbox_id}/processes/{process_id}{tail}"


async def start_pty(
    client: httpx.AsyncClient, sandbox_id: str, script: str, rows: int = 30, cols: int = 120
) -> str:
    """Start ``/bin/bash -lc script`` on a terminal (as the worker's login does)."""
    body = {
        "cmd": "/bin/bash",
        "args": ["-lc", script],
        "cwd": "/paperclip-workspace",
        "pty": {"rows": rows, "cols": cols},
    }
    proc = data(await client.post(f"/v1/sandboxes/{sandbox_id}/processes", json=body))
    assert proc["kind"] == "pty"
    return str(proc["process_id"])


async def send_keys(client: httpx.AsyncClient, sandbox_id: str, pid: str, keys: bytes) -> None:
    encoded = base64.b64encode(keys).decode()
    response = await client.post(proc_url(sandbox_id, pid, "/input"), json={"data_base64": encoded})
    assert response.status_code == 200, response.text


class Screen:
    """One live ``connect`` stream: every frame read so far, and the terminal text (no CR)."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self._lines = lines
        self.frames: list[dict[str, Any]] = []

    @property
    def text(self) -> bytes:
        return payload(self.frames).replace(b"\r", b"")

    async def until(self, marker: bytes) -> bytes:
        """Read frames until ``marker`` is on screen (or the stream ends: fail)."""
        with anyio.fail_after(20):
            while marker not in self.text:
                line = await self._lines.__anext__()
                if line:
                    self.frames.append(json.loads(line))
        return self.text

    async def to_end(self) -> list[dict[str, Any]]:
        with anyio.fail_after(20):
            async for line in self._lines:
                if line:
                    self.frames.append(json.loads(line))
        return self.frames


@asynccontextmanager
async def screen(client: httpx.AsyncClient, sandbox_id: str, pid: str) -> AsyncIterator[Screen]:
    async with client.stream("GET", proc_url(sandbox_id, pid, "/connect")) as response:
        assert response.status_code == 200
        yield Screen(response.aiter_lines())


async def test_pty_size_resize_keystrokes_and_only_pty_frames(emulator: Emulator) -> None:
    script = (
        'tty -s && echo "tty:$TERM"; stty size; echo "err" >&2; '
        'read -r line; echo "got:$line"; '
        "read -r -n1 _key; stty size; exit 3"
    )
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        pid = await start_pty(client, sandbox_id, script, rows=30, cols=120)
        async with screen(client, sandbox_id, pid) as term:
            await term.until(b"30 120\nerr\n")
            await send_keys(client, sandbox_id, pid, b"hello\r")
            await term.until(b"got:hello\n")
            resize = await client.post(
                proc_url(sandbox_id, pid, "/resize"), json={"rows": 40, "cols": 100}
            )
            assert data(resize) == {"ok": True}
            await send_keys(client, sandbox_id, pid, b"x")
            frames = await term.to_end()
        # stderr goes to the terminal too; the typed line is echoed by the tty.
        assert term.text == b"tty:xterm-256color\n30 120\nerr\nhello\ngot:hello\nx40 100\n"
        data_frames = [f for f in frames if f["type"] == "data"]
        assert data_frames and {f["stream"] for f in data_frames} == {"pty"}
        assert [f["seq"] for f in data_frames] == list(range(1, len(data_frames) + 1))
        assert frames[-1] == {"type": "exit", "exit_code": 3}
        # A replay after exit shows the same: pty frames only.
        replay = await read_frames(client, sandbox_id, pid)
        assert {f["stream"] for f in replay if f["type"] == "data"} == {"pty"}
        view = data(await client.get(proc_url(sandbox_id, pid)))
        assert view["kind"] == "pty" and view["exit_code"] == 3
        assert view["cwd"] == "/paperclip-workspace"


BAD_SIZES = [0, 1001, -1, "30", True, 30.0, None]


async def test_out_of_range_pty_sizes_are_refused(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        url = f"/v1/sandboxes/{sandbox_id}/processes"
        pid = await start_pty(client, sandbox_id, "sleep 100")
        for name in ("rows", "cols"):
            for bad in BAD_SIZES:
                size = {"rows": 30, "cols": 120, name: bad}
                body = {"cmd": "/bin/bash", "args": ["-c", "sleep 100"], "pty": size}
                created = await client.post(url, json=body)
                assert created.status_code == 400, (size, created.text)
                assert created.json()["status"] == "fail"
                resize = await client.post(proc_url(sandbox_id, pid, "/resize"), json=size)
                assert resize.status_code == 400, (size, resize.text)
        listed = data(await client.get(url))["processes"]
        assert [p["process_id"] for p in listed] == [pid]
        await client.delete(proc_url(sandbox_id, pid), params={"grace_ms": 100})


async def test_pty_edges_sizes_shapes_and_stdin_close(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        url = f"/v1/sandboxes/{sandbox_id}/processes"
        for pty in (True, "30x120", [30, 120]):
            body = {"cmd": "/bin/bash", "args": ["-c", "true"], "pty": pty}
            assert (await client.post(url, json=body)).status_code == 400
        for rows, cols in ((1, 1), (1000, 1000)):
            pid = await start_pty(client, sandbox_id, "stty size", rows=rows, cols=cols)
            frames = await read_frames(client, sandbox_id, pid)
            assert payload(frames).replace(b"\r", b"") == f"{rows} {cols}\n".encode()
        pid = await start_pty(client, sandbox_id, "read -r line; echo $line")
        for size in ({"rows": 40}, {"cols": 100}, {}):
            resize = await client.post(proc_url(sandbox_id, pid, "/resize"), json=size)
            assert resize.status_code == 400
        closed = await client.post(proc_url(sandbox_id, pid, "/stdin/close"))
        assert closed.status_code == 409 and closed.json()["status"] == "fail"
        await send_keys(client, sandbox_id, pid, b"still open\r")
        frames = await read_frames(client, sandbox_id, pid)
        assert payload(frames).replace(b"\r", b"").endswith(b"still open\n")
        assert frames[-1] == {"type": "exit", "exit_code": 0}


TAKE_TERMINAL = """
import os, signal, time
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
os.setpgid(0, 0)
os.tcsetpgrp(0, os.getpid())
open("/tmp/fg.pid", "w").write(str(os.getpid()))
print("foreground", flush=True)
time.sleep(100)
"""


async def test_pty_signal_hits_the_foreground_group(emulator: Emulator) -> None:
    # The child takes the terminal in a group of its own: the SIGINT reaches that group only,
    # so the shell (the leader) lives on to report it. Had it hit the leader's group instead,
    # the child would sleep on and the test time out.
    script = f"python3 -c '{TAKE_TERMINAL}'; echo \"after:$?\"; exit 4"
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        pid = await start_pty(client, sandbox_id, script)
        async with screen(client, sandbox_id, pid) as term:
            await term.until(b"foreground\n")
            view = data(await client.get(proc_url(sandbox_id, pid)))
            fg_pid = int((await sh(client, sandbox_id, "cat /tmp/fg.pid"))["stdout"])
            assert view["foreground"] == {
                "pid": fg_pid,
                "cmd": "python3",
                "args": ["-c", TAKE_TERMINAL],
            }
            sent = await client.post(
                proc_url(sandbox_id, pid, "/signal"), json={"signal": "SIGINT"}
            )
            assert data(sent)["delivered"] is True
            frames = await term.to_end()
        assert term.text == b"foreground\nafter:130\n"
        assert frames[-1] == {"type": "exit", "exit_code": 4}


async def test_fake_cli_in_home_local_bin_is_first_on_the_login_path(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        login_path = (await sh(client, sandbox_id, "exec /bin/bash -lc 'echo $PATH'"))["stdout"]
        assert login_path.startswith(f"{HOME_BIN}:")
        plain = await sh(client, sandbox_id, 'echo "$PATH"; stat -c %a:%u /root/.local/bin')
        assert plain["stdout"] == (
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n755:0\n"
        )
        put = await client.put(
            f"/v1/sandboxes/{sandbox_id}/files",
            params={"path": f"{HOME_BIN}/codex"},
            content=FAKE_CODEX.encode(),
        )
        assert put.status_code == 200, put.text
        assert (await sh(client, sandbox_id, f"chmod +x {HOME_BIN}/codex"))["exit_code"] == 0
        found = await sh(client, sandbox_id, "exec /bin/bash -lc 'command -v codex; codex login'")
        assert found == {
            "stdout": f"{HOME_BIN}/codex\nfake codex login home=/root\n",
            "stderr": "",
            "exit_code": 0,
        }
        # Not on the non-login PATH.
        assert (await sh(client, sandbox_id, "command -v codex"))["exit_code"] == 1
        # The worker's codex login: a PTY login shell running the fake with its session home.
        pid = await start_pty(
            client,
            sandbox_id,
            "command -v codex >/dev/null || exit 127; "
            "exec env HOME=/tmp/s CODEX_HOME=/tmp/s TERM=xterm-256color codex login; ",
        )
        frames = await read_frames(client, sandbox_id, pid)
        assert payload(frames) == b"fake codex login home=/tmp/s\r\n"
        assert frames[-1] == {"type": "exit", "exit_code": 0}


async def test_home_local_bin_is_recreated_and_kept_by_forks(emulator: Emulator) -> None:
    await emulator.admin.settings(pause_delay_ms=0, fork_busy_ms=0)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        # A login shell recreates a removed ~/.local/bin, still writable.
        script = "rm -rf /root/.local; /bin/bash -lc 'test -d ~/.local/bin && touch ~/.local/bin/t'"
        assert (await sh(client, sandbox_id, script))["exit_code"] == 0
        codex = f"{HOME_BIN}/codex"
        install = f"printf '#!/bin/sh\\necho forked-codex\\n' > {codex}; chmod +x {codex}"
        assert (await sh(client, sandbox_id, install))["exit_code"] == 0
        await client.post(f"/v1/sandboxes/{sandbox_id}/pause")
        await wait_status(client, sandbox_id, "paused")
        forked = data(await client.post(f"/v1/sandboxes/{sandbox_id}/fork", json={}))
        await wait_status(client, forked["id"], "running")
        result = await sh(client, forked["id"], "exec /bin/bash -lc 'codex; ls ~/.local/bin'")
        assert result["stdout"] == "forked-codex\ncodex\nt\n"
