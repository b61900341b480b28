"""The guest agent (``127.0.0.1:1029`` in every sandbox's own network namespace) and the network
modes around it: user-mode (slirp4netns) for allow-all sandboxes, loopback-only for restricted
ones, the host's network (and no agent) where slirp4netns is missing."""

from __future__ import annotations

import importlib
import json
import logging
import os
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import typing_extensions

from provider.emulator import Emulator
from provider.emulator.bwrap import probe_runtime
from provider.emulator.guest_agent import route
from provider.emulator.usernet import HOST_ADDRESS, find_slirp4netns

from .helpers import KEY, admin_status, api, create_sandbox, data, host_listener, sh, wait_status
from .image_fixtures import image_emulator

pytestmark = pytest.mark.anyio

ACCEPTED = "HTTP/1.1 202 Accepted\r\n"


def agent_request(method: str, target: str) -> str:
    """Bash that sends one request to the guest agent and prints the whole answer (what the
    worker's expiry guard does: the image may have no curl)."""
    line = shlex.join([method, target])
    return (
        "exec 3<>/dev/tcp/127.0.0.1/1029 || exit 7; printf '%s %s HTTP/1.1\\r\\nHost: "
        f"127.0.0.1:1029\\r\\nContent-Length: 0\\r\\n\\r\\n' {line} >&3; cat <&3"
    )


async def refused(client: httpx.AsyncClient, sandbox_id: str) -> bool:
    """Whether a connection to 127.0.0.1:1029 in the sandbox is refused."""
    got = await sh(client, sandbox_id, "exec 3<>/dev/tcp/127.0.0.1/1029 || echo refused")
    return bool(got["stdout"] == "refused\n" and "Connection refused" in got["stderr"])


def body_of(answer: str) -> Any:
    return json.loads(answer.split("\r\n\r\n", 1)[1])


async def wait_gone(client: httpx.AsyncClient, sandbox_id: str) -> None:
    """Until the API shows the sandbox as an API delete leaves it: destroyed, then 404."""
    with anyio.fail_after(20):
        while True:
            response = await client.get(f"/v1/sandboxes/{sandbox_id}")
            if response.status_code == 404 or data(response)["status"] == "destroyed":
                return
            await anyio.sleep(0.02)


async def state_row(emu: Emulator, sandbox_id: str) -> dict[str, Any]:
    for row in (await emu.admin.state())["sandboxes"]:
        if row["id"] == sandbox_id:
            return dict(row)
    raise AssertionError(f"{sandbox_id} is not live")


def processes_mentioning(text: str) -> list[int]:
    """Host pids whose command line holds ``text`` (a sandbox's bwrap names the data dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def exited(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has exited (a pidfd polls readable then)."""
    return bool(select.select([pidfd], [], [], 0)[0])


async def test_each_sandbox_serves_its_own_agent_and_self_delete_touches_only_it(
    emulator: Emulator,
) -> None:
    await emulator.admin.settings(pause_delay_ms=0, resume_delay_ms=0)
    async with api(emulator) as client:
        first = await create_sandbox(client)  # allow-all
        second = await create_sandbox(client, egress=["example.com"])  # restricted: one too
        for method, target, status in (
            ("GET", "/self/delete", "405 Method Not Allowed"),
            ("POST", "/self/reboot", "404 Not Found"),
            ("POST", "/", "404 Not Found"),
        ):
            got = await sh(client, first, agent_request(method, target))
            assert got["stdout"].startswith(f"HTTP/1.1 {status}\r\n"), got
        garbage = await sh(
            client, first, "exec 3<>/dev/tcp/127.0.0.1/1029; printf 'hi\\r\\n\\r\\n' >&3; cat <&3"
        )
        assert garbage["stdout"].startswith("HTTP/1.1 400 Bad Request\r\n"), garbage

        results: dict[str, dict[str, Any]] = {}

        async def pause_itself() -> None:
            results["pause"] = await sh(
                client, first, agent_request("POST", f"/self/pause?reason=from%20{first}")
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(pause_itself)  # answers before the freeze or after the resume
            await wait_status(client, first, "paused")
            assert await admin_status(emulator, second) == "running"
            assert (await client.post(f"/v1/sandboxes/{first}/resume")).status_code == 202
            await wait_status(client, first, "running")
        assert results["pause"]["stdout"].startswith(ACCEPTED), results
        assert body_of(results["pause"]["stdout"]) == {"status": "accepted", "action": "pause"}
        again = await sh(client, first, agent_request("GET", "/self/pause"))
        assert again["stdout"].startswith("HTTP/1.1 405 "), again  # resumed: it serves again

        await sh(client, second, agent_request("POST", "/self/delete?reason=done+here") + " &")
        await wait_gone(client, second)
        assert await admin_status(emulator, second) is None
        alive = await sh(client, first, "echo still here")
        assert alive["stdout"] == "still here\n"
        history = await emulator.admin.self_history()
        assert [(h["sandbox_id"], h["action"], h["reason"]) for h in history] == [
            (first, "pause", f"from {first}"),
            (second, "delete", "done here"),
        ]
        calls = {(r["method"], r["path"]) for r in await emulator.admin.requests()}
        assert ("DELETE", f"/v1/sandboxes/{second}") not in calls  # the agent did it


async def test_a_silent_agent_client_blocks_neither_the_agent_nor_the_supervisor(
    emulator: Emulator,
) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        holders = (
            "for i in 1 2 3; do (exec 3<>/dev/tcp/127.0.0.1/1029; printf 'POST /self/de' >&3; "
            ": >/tmp/held.$i; sleep 60) & done; "
            "until [ -e /tmp/held.1 ] && [ -e /tmp/held.2 ] && [ -e /tmp/held.3 ]; do sleep 0.01; "
            "done; echo holding"
        )
        assert (await sh(client, sandbox_id, holders))["stdout"] == "holding\n"
        got = await sh(client, sandbox_id, agent_request("GET", "/self/delete"))
        assert got["stdout"].startswith("HTTP/1.1 405 "), got  # served beside the silent ones
        assert (await sh(client, sandbox_id, "echo spawned"))["stdout"] == "spawned\n"
        assert await admin_status(emulator, sandbox_id) == "running"  # half a request: nothing


async def test_guest_agent_setting_off_makes_1029_refuse(emulator: Emulator) -> None:
    async with api(emulator) as client:
        await emulator.admin.settings(guest_agent=False)
        for egress in (None, ["example.com"]):
            without = await create_sandbox(client, egress=egress)
            assert await refused(client, without)
        await emulator.admin.settings(guest_agent=True)
        with_agent = await create_sandbox(client)
        got = await sh(client, with_agent, agent_request("GET", "/self/delete"))
        assert got["stdout"].startswith("HTTP/1.1 405 "), got


async def test_user_mode_network_reaches_the_host_and_its_helper_lives_with_the_sandbox() -> None:
    if find_slirp4netns() is None:
        pytest.skip("slirp4netns is not installed (make setup installs it)")
    emu = Emulator(api_keys=[KEY], settings={"pause_delay_ms": 0, "resume_delay_ms": 0})
    pidfds: dict[str, int] = {}
    try:
        async with emu, api(emu) as client, host_listener() as port:
            kept = await create_sandbox(client)
            dropped = await create_sandbox(client, egress=["*"])
            restricted = await create_sandbox(client, egress=["example.com"])
            for sandbox_id in (kept, dropped):
                row = await state_row(emu, sandbox_id)
                assert row["network"] == "user-mode"
                pid = row["network_pid"]
                assert Path(f"/proc/{pid}/comm").read_text() == "slirp4netns\n"
                pidfds[sandbox_id] = os.pidfd_open(pid)
            assert (await state_row(emu, restricted))["network_pid"] is None
            direct = (
                f"timeout 5 bash -c 'exec 3<>/dev/tcp/{HOST_ADDRESS}/{port} && head -n 1 <&3'"
                " 2>&1; cat /proc/net/route | awk '$2 == \"00000000\" {print $1, $3}'"
            )
            got = await sh(client, kept, direct)
            assert got["stdout"] == "hello\ntap0 0202000A\n", got  # default route: 10.0.2.2
            got = await sh(client, restricted, direct)
            assert "hello" not in got["stdout"] and "tap0" not in got["stdout"], got
            before = (await state_row(emu, kept))["network_pid"]
            await client.post(f"/v1/sandboxes/{kept}/pause")
            await wait_status(client, kept, "paused")
            await client.post(f"/v1/sandboxes/{kept}/resume")
            await wait_status(client, kept, "running")
            assert (await state_row(emu, kept))["network_pid"] == before  # the same guest
            assert (await sh(client, kept, direct))["stdout"].startswith("hello\n")
            assert (await client.delete(f"/v1/sandboxes/{dropped}")).status_code == 200
            assert exited(pidfds[dropped])  # stopped before the delete answered
            assert not exited(pidfds[kept])
        assert exited(pidfds[kept])  # the emulator's shutdown stopped it
        assert emu.leaked_host_pids() == []
    finally:
        for fd in pidfds.values():
            os.close(fd)


async def test_without_slirp4netns_allow_all_sandboxes_share_the_host_network_and_have_no_agent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CREATEOS_EMULATOR_SLIRP4NETNS", "")
    find_slirp4netns.cache_clear()
    try:
        emu = Emulator(api_keys=[KEY])
        with caplog.at_level(logging.WARNING, logger="provider.emulator"):
            async with emu, api(emu) as client:
                assert "slirp4netns not found" in caplog.text
                shared = await create_sandbox(client)
                restricted = await create_sandbox(client, egress=["example.com"])
                row = await state_row(emu, shared)
                assert (row["network"], row["network_pid"]) == ("host", None)
                assert (await state_row(emu, restricted))["network"] == "loopback-only"
                interfaces = await sh(client, shared, "tail -n +3 /proc/net/dev | wc -l")
                assert int(interfaces["stdout"]) > 1  # the host's interfaces
                assert await refused(client, shared)  # no agent: an honest refusal
                got = await sh(client, restricted, agent_request("GET", "/self/delete"))
                assert got["stdout"].startswith("HTTP/1.1 405 "), got
        assert emu.leaked_host_pids() == []
    finally:
        find_slirp4netns.cache_clear()


async def test_a_user_mode_network_that_cannot_start_fails_the_create_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "slirp4netns"
    broken.write_text("#!/bin/sh\necho 'cannot open /dev/net/tun' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CREATEOS_EMULATOR_SLIRP4NETNS", str(broken))
    find_slirp4netns.cache_clear()
    try:
        emu = Emulator(api_keys=[KEY])
        async with emu, api(emu) as client:
            response = await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
            assert response.status_code == 503, response.text
            assert (await emu.admin.state())["sandboxes"] == []
            assert emu.core is not None
            assert processes_mentioning(str(emu.core.data_dir)) == []  # its bwrap is gone
            restricted = await create_sandbox(client, egress=["example.com"])  # needs none
            assert (await state_row(emu, restricted))["network"] == "loopback-only"
            assert processes_mentioning(str(emu.core.data_dir)) != []  # the check sees a live one
    finally:
        find_slirp4netns.cache_clear()


# The official SDK and its pure-Python dependencies, copied into an image for the guest's python3.
SDK_PACKAGES = ("createos", "httpx", "httpcore", "h11", "anyio", "idna", "certifi")


@contextmanager
def sdk_image() -> Iterator[Path]:
    """A folder image whose ``/usr/local/lib/python3.X/dist-packages`` holds the SDK (X: the
    guest python's minor version, which must be the test interpreter's: skips otherwise)."""
    guest = subprocess.run(
        [probe_runtime().python, "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if guest != str(sys.version_info[:2]):
        pytest.skip(f"the guest python {guest} cannot import this interpreter's SDK copy")
    root = Path(tempfile.mkdtemp(prefix="createos-sdk-image-"))
    try:
        root.chmod(0o755)
        minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        site = root / "usr/local/lib" / minor / "dist-packages"
        for name in SDK_PACKAGES:
            source = Path(importlib.import_module(name).__file__ or "").parent
            shutil.copytree(source, site / name, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(typing_extensions.__file__ or "", site)
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_the_official_sdk_pauses_and_deletes_its_own_sandbox() -> None:
    with sdk_image() as folder:
        async with image_emulator({"sdk:1": folder}) as emu, api(emu) as client:
            await emu.admin.settings(pause_delay_ms=0, resume_delay_ms=0)
            pausing = await create_sandbox(client, rootfs="sdk:1")
            deleting = await create_sandbox(client, rootfs="sdk:1", egress=["example.com"])
            call = 'python3 -c \'import createos; createos.self_{}("{}"); print("202")\''
            results: dict[str, dict[str, Any]] = {}

            async def pause_itself() -> None:
                results["pause"] = await sh(client, pausing, call.format("pause", "sdk"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(pause_itself)
                await wait_status(client, pausing, "paused")
                await client.post(f"/v1/sandboxes/{pausing}/resume")
            assert results["pause"]["stdout"] == "202\n", results
            await sh(client, deleting, call.format("delete", "sdk done") + " &")
            await wait_gone(client, deleting)
            assert (await sh(client, pausing, "echo on"))["stdout"] == "on\n"
            history = await emu.admin.self_history()
            assert [(h["sandbox_id"], h["action"], h["reason"]) for h in history] == [
                (pausing, "pause", "sdk"),
                (deleting, "delete", "sdk done"),
            ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"POST /self/delete HTTP/1.1", (202, "delete", "")),
        (b"POST /self/pause?reason=idle%20now&x=1 HTTP/1.0", (202, "pause", "idle now")),
        (b"POST /self/delete?reason=a+b%C3%A9 HTTP/1.1", (202, "delete", "a b\u00e9")),
        (b"POST /self/delete?reason=" + b"x" * 300 + b" HTTP/1.1", (202, "delete", "x" * 200)),
        (b"GET /self/delete HTTP/1.1", (405, "", "")),
        (b"POST /self/resume HTTP/1.1", (404, "", "")),
        (b"POST /self/delete", (400, "", "")),
        (b"hello", (400, "", "")),
    ],
)
def test_request_lines(line: bytes, expected: tuple[int, str, str]) -> None:
    assert route(line) == expected
