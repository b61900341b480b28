"""A 503 on a POST means the server did not process it (as both official SDKs read it): create,
process start, fork and exec are retried, and the emulator ends with exactly one of each."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from provider.createos.client import CreateOSClient
from provider.emulator.server import Emulator

pytestmark = pytest.mark.anyio


async def statuses(emu: Emulator, method: str, suffix: str) -> list[int]:
    return [
        r["status"]
        for r in await emu.admin.requests()
        if r["method"] == method and r["path"].endswith(suffix)
    ]


async def live(emu: Emulator) -> list[dict[str, Any]]:
    state = await emu.admin.state()
    return [s for s in state["sandboxes"] if s["status"] not in ("destroying", "destroyed")]


async def new_sandbox(api: CreateOSClient) -> str:
    return await api.create_sandbox(shape="s-1vcpu-1gb", name="pc-503", rootfs=None, region=None)


async def test_a_create_answered_503_then_ok_makes_exactly_one_sandbox(
    emu: Emulator, api: CreateOSClient
) -> None:
    await emu.admin.add_fault("POST", r"^/v1/sandboxes$", times=1, status=503, retry_after="0")

    sandbox_id = await new_sandbox(api)

    assert await statuses(emu, "POST", "/v1/sandboxes") == [503, 200]
    assert [s["id"] for s in await live(emu)] == [sandbox_id]


async def test_a_process_start_answered_503_then_ok_starts_exactly_one_process(
    emu: Emulator, api: CreateOSClient
) -> None:
    sandbox_id = await new_sandbox(api)
    await emu.admin.add_fault("POST", r"/processes$", times=2, status=503)

    view = await api.create_process(sandbox_id, cmd="/bin/sleep", args=["30"])

    assert await statuses(emu, "POST", "/processes") == [503, 503, 200]
    assert [p.process_id for p in await api.list_processes(sandbox_id)] == [view.process_id]
    await api.delete_process(sandbox_id, view.process_id, grace_ms=0)


async def test_an_exec_answered_503_then_ok_runs_the_command_once(
    emu: Emulator, api: CreateOSClient
) -> None:
    sandbox_id = await new_sandbox(api)
    await emu.admin.add_fault("POST", r"/exec$", times=1, status=503)

    await api.exec(sandbox_id, "/bin/bash", ["-c", "echo ran >> /paperclip-workspace/runs"])

    assert await statuses(emu, "POST", "/exec") == [503, 200]
    counted = await api.exec(sandbox_id, "/bin/cat", ["/paperclip-workspace/runs"])
    assert counted.stdout == "ran\n"


async def test_a_fork_answered_503_then_ok_makes_exactly_one_fork(
    emu: Emulator, api: CreateOSClient
) -> None:
    source = await new_sandbox(api)
    await api.pause_sandbox(source)
    with anyio.fail_after(30):
        while (await api.get_sandbox(source)).status != "paused":
            await anyio.sleep(0.05)
    await emu.admin.add_fault("POST", r"/fork$", times=1, status=503)

    fork_id, _ = await api.fork_sandbox(
        source, start_paused=True, egress=["*"], ingress_enabled=False
    )

    assert await statuses(emu, "POST", "/fork") == [503, 200]
    assert sorted(s["id"] for s in await live(emu)) == sorted([source, fork_id])
