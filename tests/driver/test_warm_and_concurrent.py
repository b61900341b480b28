"""Warm reuse through the emulator's idle pause, keepalive reads, and concurrent syncs on one
lease (docs/protocol.md 2.10, 5.10; checklist 65, 68, 69)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest

from provider.errors import OperationCancelled
from tests.driver.conftest import Harness
from tests.driver.sync_helpers import mapping, op, sh, sync_in
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio
WARM: dict[str, Any] = {"reuseLease": True, "autoPauseAfterSeconds": 60}


def uploads_held(h: Harness) -> int:
    """How many uploads the emulator's delay fault has caught so far (of the two it holds)."""
    assert h.emulator.core is not None
    return 2 - sum(fault.times for fault in h.emulator.core.faults)


async def status_of(h: Harness, sandbox_id: str) -> str:
    state = await h.emulator.admin.state()  # admin reads are not activity
    for sandbox in state["sandboxes"]:
        if sandbox["id"] == sandbox_id:
            return str(sandbox["status"])
    return "gone"


async def test_a_warm_lease_idle_paused_by_createos_resumes_with_one_request(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire(**WARM)
    sandbox_id = lease["providerLeaseId"]
    await sh(h, lease, "echo kept > /paperclip-workspace/kept.txt")  # (with_lease: no window)
    receipt = await h.methods.release(h.lease_ref(lease, **WARM))
    assert receipt == {"providerLeaseId": sandbox_id, "state": "stopped"}
    assert await status_of(h, sandbox_id) == "running"
    await h.emulator.admin.idle_pause(sandbox_id)  # CreateOS's idle timer fires
    with anyio.fail_after(20):
        while await status_of(h, sandbox_id) != "paused":
            await anyio.sleep(0.05)
    since = await h.request_count()
    resumed = await h.methods.resume(h.lease_ref(lease, **WARM))
    assert resumed["providerLeaseId"] == sandbox_id
    requests = (await h.emulator.admin.requests())[since:]
    assert [r["path"].endswith("/resume") for r in requests].count(True) == 1
    kept = await h.methods.execute(
        {
            **h.with_lease(resumed, **WARM),
            "command": "cat",
            "args": ["kept.txt"],
            "cwd": "/paperclip-workspace",
        }
    )
    assert kept["stdout"] == "kept\n"
    await h.methods.destroy(h.lease_ref(resumed, **WARM))


async def test_keepalive_reads_keep_a_silent_command_from_being_idle_paused(
    harness: Harness,
) -> None:
    h = harness
    await h.emulator.admin.settings(auto_pause_time_scale=0.02)  # a 60 s window idles in 1.2 s
    h.methods.runtime.keepalive_interval = lambda window: window * 0.02 / 4
    lease = await h.acquire(**WARM)
    sandbox_id = lease["providerLeaseId"]
    before = await h.request_count()
    with anyio.fail_after(30):
        result = await h.methods.execute(
            {**h.with_lease(lease, **WARM), "command": "sleep", "args": ["4"]}
        )
    assert result["exitCode"] == 0 and result["timedOut"] is False
    assert await status_of(h, sandbox_id) == "running"
    reads = [
        r
        for r in (await h.emulator.admin.requests())[before:]
        if r["method"] == "GET" and r["path"] == f"/v1/sandboxes/{sandbox_id}"
    ]
    assert len(reads) >= 4  # one every 0.3 s while the command slept
    # ... and without work, the same sandbox does idle-pause on its own
    with anyio.fail_after(20):
        while await status_of(h, sandbox_id) != "paused":
            await anyio.sleep(0.1)
    await h.methods.destroy(h.lease_ref(lease, **WARM))


def tree(root: Path, name: str, files: int) -> Path:
    """``files`` files of about 90 KB: an archive too large to travel inline, so it is PUT."""
    folder = root / name
    folder.mkdir()
    for n in range(files):
        (folder / f"f{n}.txt").write_text(f"{name} {n}\n" * 10_000)
    return folder


async def test_two_syncs_on_one_lease_overlap_in_isolation_and_release_cancels_both(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    first, second = tree(tmp_path, "first", 3), tree(tmp_path, "second", 4)
    await h.emulator.admin.add_fault("PUT", r"/files$", delay_ms=800, times=2)
    since = await h.request_count()
    results: dict[str, Any] = {}

    async def run(name: str, source: Path) -> None:
        target = f"/paperclip-workspace/{name}"
        results[name] = await sync_in(h, lease, op(mapping(source, target, "directory")))

    async with anyio.create_task_group() as group:
        group.start_soon(run, "first", first)
        await wait_until(lambda: uploads_held(h) == 1)  # the first sync is uploading
        group.start_soon(run, "second", second)
    assert results["first"]["operations"][0]["filesTransferred"] == 3
    assert results["second"]["operations"][0]["filesTransferred"] == 4
    requests = (await h.emulator.admin.requests())[since:]
    puts = [r for r in requests if r["method"] == "PUT"]
    assert len(puts) == 2
    assert len({r["query"] for r in puts}) == 2, "each sync has its own sandbox scratch path"
    # overlap: the second upload started before the first sync's last request
    second_put = requests.index(puts[1])
    commands = [
        i for i, r in enumerate(requests) if r["method"] == "POST" and r["path"].endswith("/exec")
    ]
    assert second_put < max(commands)
    listing = await sh(h, lease, "ls /paperclip-workspace/first /paperclip-workspace/second")
    assert listing["stdout"].count(".txt") == 7

    # A release during two slow syncs cancels both and waits for their cleanup.
    await h.emulator.admin.add_fault("PUT", r"/files$", delay_ms=3000, times=2)
    failures: list[BaseException] = []

    async def cancelled(name: str, source: Path) -> None:
        try:
            await run(name, source)
        except OperationCancelled as exc:
            failures.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(cancelled, "third", first)
        group.start_soon(cancelled, "fourth", second)
        await wait_until(lambda: uploads_held(h) == 2)  # both syncs are uploading
        receipt = await h.methods.release(h.lease_ref(lease))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}
    assert len(failures) == 2
    leftovers = [
        p
        for p in Path(tempfile.gettempdir()).iterdir()
        if p.name.startswith(".paperclip-createos-")
    ]
    assert leftovers == []
