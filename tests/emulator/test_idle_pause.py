"""Idle auto-pause (checklist 88): an armed running sandbox quiet for N x auto_pause_time_scale
seconds is paused; requests naming it and its processes' output keep it awake, an open connect
stream alone and admin calls do not; PATCH arms and disarms; the admin hook pauses at once.

With ``auto_pause_time_scale`` 0.02 the minimum window (60 s) lasts 1.2 s. Statuses are read
through the admin API while waiting, since a ``GET`` of the sandbox would be activity.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from provider.emulator import Emulator
from provider.emulator.client import EmulatorAdminError

from .helpers import (
    admin_status,
    api,
    create_sandbox,
    data,
    sh,
    start_process,
    wait_status,
    wait_status_quietly,
)

pytestmark = pytest.mark.anyio
SCALE = 0.02
WINDOW = 60  # x SCALE = 1.2 s
IDLE_S = WINDOW * SCALE


async def _fast(emu: Emulator) -> None:
    await emu.admin.settings(auto_pause_time_scale=SCALE, pause_delay_ms=0, resume_delay_ms=0)


async def _stays(emu: Emulator, sandbox_id: str, status: str, seconds: float) -> None:
    """``status`` throughout ``seconds`` (admin reads only)."""
    deadline = anyio.current_time() + seconds
    while anyio.current_time() < deadline:
        assert await admin_status(emu, sandbox_id) == status
        await anyio.sleep(0.1)


def _stopped(host_pid: int) -> bool:
    stat = Path(f"/proc/{host_pid}/stat").read_text()
    return stat[stat.rfind(")") + 2] == "T"


async def test_an_idle_armed_sandbox_pauses_and_resumes_with_its_files(emulator: Emulator) -> None:
    await _fast(emulator)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client, auto_pause_after_seconds=WINDOW)
        await sh(client, sandbox_id, "echo kept > /paperclip-workspace/f; echo h > /root/h")
        process = await start_process(client, sandbox_id, "sleep 1000")
        started = anyio.current_time()
        await wait_status_quietly(emulator, sandbox_id, "paused")
        waited = anyio.current_time() - started
        assert IDLE_S - 0.1 <= waited <= IDLE_S + 3, waited
        view = data(await client.get(f"/v1/sandboxes/{sandbox_id}"))
        assert view["status"] == "paused" and view["auto_pause_after_seconds"] == WINDOW
        assert "paused_at" in view
        # Frozen as with POST /pause.
        state = await emulator.admin.state()
        (row,) = [p for p in state["processes"] if p["process_id"] == process["process_id"]]
        assert row["host_pids"] and all(_stopped(pid) for pid in row["host_pids"])
        resumed = await client.post(f"/v1/sandboxes/{sandbox_id}/resume")
        assert resumed.status_code == 202
        await wait_status(client, sandbox_id, "running")
        result = await sh(client, sandbox_id, "cat /paperclip-workspace/f /root/h")
        assert result["stdout"] == "kept\nh\n"
        assert not any(_stopped(pid) for pid in row["host_pids"])
        # Still armed: quiet again, it pauses again.
        await wait_status_quietly(emulator, sandbox_id, "paused")


async def test_requests_keep_it_awake(emulator: Emulator) -> None:
    await _fast(emulator)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client, auto_pause_after_seconds=WINDOW)
        base = f"/v1/sandboxes/{sandbox_id}"
        calls = [
            ("GET", base),
            ("GET", f"{base}/egress"),
            ("GET", f"{base}/processes"),
            ("GET", f"{base}/files?path=/tmp/none"),  # a 404 names it too
            ("GET", f"{base}/no-such-route"),
        ]
        deadline = anyio.current_time() + IDLE_S * 2.5
        index = 0
        while anyio.current_time() < deadline:
            method, path = calls[index % len(calls)]
            await client.request(method, path)
            assert await admin_status(emulator, sandbox_id) == "running"
            index += 1
            await anyio.sleep(0.3)
        waited = await wait_status_quietly(emulator, sandbox_id, "paused")
        assert waited >= IDLE_S - 0.4


async def test_another_key_cannot_keep_it_awake(emulator: Emulator) -> None:
    await _fast(emulator)
    async with api(emulator) as client, api(emulator, key="other-key") as other:
        sandbox_id = await create_sandbox(client, auto_pause_after_seconds=WINDOW)
        started = anyio.current_time()
        while await admin_status(emulator, sandbox_id) == "running":
            assert (await other.get(f"/v1/sandboxes/{sandbox_id}")).status_code == 404
            await anyio.sleep(0.2)
            assert anyio.current_time() - started < IDLE_S + 3
        assert await admin_status(emulator, sandbox_id) in ("pausing", "paused")


async def test_process_output_keeps_it_awake(emulator: Emulator) -> None:
    await _fast(emulator)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client, auto_pause_after_seconds=WINDOW)
        printer = await start_process(client, sandbox_id, "while true; do echo x; sleep 0.3; done")
        await _stays(emulator, sandbox_id, "running", IDLE_S * 2.5)
        gone = await client.delete(
            f"/v1/sandboxes/{sandbox_id}/processes/{printer['process_id']}",
            params={"grace_ms": 100},
        )
        assert data(gone)["tree_exited"] is True
        waited = await wait_status_quietly(emulator, sandbox_id, "paused")
        assert waited >= IDLE_S - 0.4


async def test_an_open_connect_stream_alone_is_not_activity(emulator: Emulator) -> None:
    await _fast(emulator)
    await emulator.admin.settings(heartbeat_ms=100)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client, auto_pause_after_seconds=WINDOW)
        silent = await start_process(client, sandbox_id, "sleep 1000")
        path = f"/v1/sandboxes/{sandbox_id}/processes/{silent['process_id']}/connect"
        lines: list[str] = []

        async def follow(stream: httpx.Response) -> None:
            async for line in stream.aiter_lines():
                lines.append(line)

        async with client.stream("GET", path) as stream, anyio.create_task_group() as tg:
            assert stream.status_code == 200
            tg.start_soon(follow, stream)
            await wait_status_quietly(emulator, sandbox_id, "paused", timeout=IDLE_S + 5)
            tg.cancel_scope.cancel()
        assert any("heartbeat" in line for line in lines)


async def test_patch_arms_with_range_check_and_disarms(emulator: Emulator) -> None:
    await _fast(emulator)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        base = f"/v1/sandboxes/{sandbox_id}"
        await _stays(emulator, sandbox_id, "running", IDLE_S * 1.5)  # not armed
        for bad in (59, 86_401, "60", True, 60.5):
            response = await client.patch(base, json={"auto_pause_after_seconds": bad})
            assert response.status_code == 400
            assert "auto_pause_after_seconds" in response.json()["data"]
        bad_flag = await client.patch(base, json={"disable_auto_pause": "yes"})
        assert bad_flag.status_code == 400
        assert "auto_pause_after_seconds" not in data(await client.get(base))
        armed = data(await client.patch(base, json={"auto_pause_after_seconds": WINDOW}))
        assert armed["auto_pause_after_seconds"] == WINDOW
        waited = await wait_status_quietly(emulator, sandbox_id, "paused")
        assert IDLE_S - 0.1 <= waited <= IDLE_S + 3

        second = await create_sandbox(client, auto_pause_after_seconds=WINDOW)
        disarmed = data(
            await client.patch(f"/v1/sandboxes/{second}", json={"disable_auto_pause": True})
        )
        assert "auto_pause_after_seconds" not in disarmed
        await _stays(emulator, second, "running", IDLE_S * 2)
        with pytest.raises(EmulatorAdminError) as refused:
            await emulator.admin.idle_pause(second)
        assert refused.value.status == 409


async def test_admin_hook_pauses_an_armed_sandbox_at_once(emulator: Emulator) -> None:
    await emulator.admin.settings(pause_delay_ms=0)  # time scale 1: a 600 s window
    async with api(emulator) as client:
        armed = await create_sandbox(client, auto_pause_after_seconds=600)
        plain = await create_sandbox(client)
        view = await emulator.admin.idle_pause(armed)
        assert view["id"] == armed and view["status"] in ("pausing", "paused")
        assert await wait_status_quietly(emulator, armed, "paused", timeout=2) < 1
        for sandbox_id in (armed, plain):  # paused / not armed
            with pytest.raises(EmulatorAdminError) as refused:
                await emulator.admin.idle_pause(sandbox_id)
            assert refused.value.status == 409
        with pytest.raises(EmulatorAdminError) as missing:
            await emulator.admin.idle_pause("sb_nope")
        assert missing.value.status == 404
        await client.post(f"/v1/sandboxes/{armed}/resume")
        await wait_status(client, armed, "running")
        assert (await sh(client, armed, "echo back"))["stdout"] == "back\n"


async def test_time_scale_setting_is_checked_and_applies_to_armed_timers(
    emulator: Emulator,
) -> None:
    assert (await emulator.admin.settings())["auto_pause_time_scale"] == 1.0
    for bad in (0, -1, "fast", True, None):
        with pytest.raises(EmulatorAdminError):
            await emulator.admin.settings(auto_pause_time_scale=bad)
    await emulator.admin.settings(pause_delay_ms=0)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client, auto_pause_after_seconds=WINDOW)
        await _stays(emulator, sandbox_id, "running", 0.5)  # 60 s window at scale 1
        changed = await emulator.admin.settings(auto_pause_time_scale=SCALE)
        assert changed["auto_pause_time_scale"] == SCALE
        # The sleeping timer notices the shorter window (already over: pause right away).
        assert await wait_status_quietly(emulator, sandbox_id, "paused", timeout=3) < 1.5
    assert (await emulator.admin.settings(auto_pause_time_scale=2))["auto_pause_time_scale"] == 2.0


async def test_a_fork_keeps_the_setting_and_idles_on_its_own(emulator: Emulator) -> None:
    await _fast(emulator)
    async with api(emulator) as client:
        source = await create_sandbox(client, auto_pause_after_seconds=WINDOW)
        await emulator.admin.idle_pause(source)
        await wait_status_quietly(emulator, source, "paused")
        forked = data(await client.post(f"/v1/sandboxes/{source}/fork", json={}))
        assert forked["auto_pause_after_seconds"] == WINDOW
        await wait_status_quietly(emulator, forked["id"], "running")
        waited = await wait_status_quietly(emulator, forked["id"], "paused")
        assert waited <= IDLE_S + 3
        assert await admin_status(emulator, source) == "paused"


async def test_delete_and_shutdown_end_the_timers(emulator: Emulator) -> None:
    emu = Emulator(api_keys=["k"], settings={"auto_pause_time_scale": SCALE})
    async with emu, api(emu, key="k") as client:
        ids = [await create_sandbox(client, auto_pause_after_seconds=WINDOW) for _ in range(3)]
        await client.delete(f"/v1/sandboxes/{ids[0]}")
        await start_process(client, ids[1], "while true; do echo x; sleep 0.2; done")
    assert emu.leaked_host_pids() == []
