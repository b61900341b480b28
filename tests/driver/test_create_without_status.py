"""Acquire when the create answer names no status (the body the TS SDK describes).

The emulator's ``create_omits_status`` setting answers the create without ``status``. The TS
SDK says such a create answers once the sandbox is booted, so the driver prepares the workspace
at once without a read; an exec refused with 409 (the sandbox was not running yet: nothing ran)
makes it read the sandbox until it is ``running`` and run the exec then.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.driver.conftest import Harness

pytestmark = pytest.mark.anyio


async def acquire_requests(h: Harness) -> tuple[str, list[str]]:
    """Acquire a disposable lease; answers its sandbox id and the requests that named it or
    created it, as ``METHOD path`` (the reaper's listings are left out)."""
    since = await h.request_count()
    lease = await h.acquire(workspace=False)
    sandbox_id = str(lease["providerLeaseId"])
    rows: list[dict[str, Any]] = (await h.emulator.admin.requests())[since:]
    seen = [
        f"{row['method']} {row['path'].replace(sandbox_id, '{id}')}"
        for row in rows
        if (row["path"], row["method"]) == ("/v1/sandboxes", "POST") or sandbox_id in row["path"]
    ]
    await h.methods.destroy(h.lease_ref(lease))
    return sandbox_id, seen


async def test_acquire_without_a_status_runs_the_workspace_exec_at_once(harness: Harness) -> None:
    h = harness
    await h.emulator.admin.settings(create_omits_status=True)
    sandbox_id, seen = await acquire_requests(h)
    assert seen == [
        "POST /v1/sandboxes",
        "POST /v1/sandboxes/{id}/exec",  # workspace and marker: the read that shows running
    ]
    assert sandbox_id.startswith("sb_")


async def test_acquire_polls_a_create_without_status_until_running(harness: Harness) -> None:
    # The create answers while the sandbox is still creating (booted in the background, kept
    # creating until the test lets it run): the driver keeps reading until it is running.
    h = harness
    await h.emulator.admin.settings(
        create_omits_status=True, create_mode="async", create_delay_ms=600_000
    )
    since = await h.request_count()
    leases: list[dict[str, Any]] = []

    async def acquire() -> None:
        leases.append(await h.acquire(workspace=False))

    async with anyio.create_task_group() as tg:
        tg.start_soon(acquire)
        with anyio.fail_after(30):
            while True:  # two reads that found it creating, and its guest is up
                rows = (await h.emulator.admin.requests())[since:]
                reads = [r for r in rows if r["method"] == "GET" and r["path"] != "/v1/sandboxes"]
                state = await h.emulator.admin.state()
                booted = [s for s in state["sandboxes"] if s["host_pids"]]
                if len(reads) >= 2 and booted:
                    break
                await anyio.sleep(0.02)
        assert leases == []  # still waiting for running
        await h.emulator.admin.force_state(booted[0]["id"], "running")
    (lease,) = leases
    sandbox_id = str(lease["providerLeaseId"])
    assert sandbox_id == booted[0]["id"]
    rows = (await h.emulator.admin.requests())[since:]
    seen = [(r["method"], r["status"]) for r in rows if sandbox_id in r["path"]]
    # the exec refused while creating (nothing ran), reads until running, then the exec
    assert seen[0] == ("POST", 409) and seen[-1] == ("POST", 200)
    assert {method for method, _ in seen[1:-1]} == {"GET"} and len(seen) >= 4
    await h.methods.destroy(h.lease_ref(lease))


async def test_a_create_that_names_running_needs_no_read(harness: Harness) -> None:
    # The control: with the status in the answer the same acquire skips the read, so the tests
    # above see the knob's effect and not a read the driver always makes.
    _sandbox_id, seen = await acquire_requests(harness)
    assert seen == ["POST /v1/sandboxes", "POST /v1/sandboxes/{id}/exec"]
