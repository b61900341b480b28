"""Leases with ``requestedExpiresAt`` on the real emulator: the expiry guard inside the sandbox
and the worker's own line each delete the sandbox at the deadline alone; a worker restarted
after the deadline deletes it at its first call; deadlines too close and a guard that cannot
start leave nothing behind."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from provider.config import EnvironmentConfig, parse_config
from provider.createos.client import CreateOSClient
from provider.driver.commands.expiry_guard import PID_FILE
from provider.driver.core.runtime import BoundCall, DriverRuntime
from provider.driver.leases.expiry import MIN_LEAD_SECONDS, delete_expired_at_start, iso
from provider.driver.leases.reaper import Reaper
from provider.driver.service import DriverService
from provider.errors import ProviderError, RequestRefused

from .conftest import Harness, unpaced_client

pytestmark = pytest.mark.anyio


def acquire_params(harness: Harness, deadline: float) -> dict[str, Any]:
    """A login lease as the host asks for it: an agent, no workspace, an ISO deadline."""
    return {**harness.acquire_params(), "requestedExpiresAt": iso(deadline)}


async def sandbox_ids(harness: Harness) -> set[str]:
    state = await harness.emulator.admin.state()
    return {box["id"] for box in state["sandboxes"] if box["status"] != "destroyed"}


async def wait_gone(harness: Harness, sandbox_id: str, *, within: float) -> float:
    """Poll the emulator until the sandbox is gone; returns the wall time it was seen gone."""
    with anyio.fail_after(within):
        while sandbox_id in await sandbox_ids(harness):
            await anyio.sleep(0.2)
    return time.time()


async def sh(harness: Harness, sandbox_id: str, script: str) -> str:
    config = parse_config(harness.config())
    async with unpaced_client(config, "test-key") as client:
        result = await client.exec(sandbox_id, "/bin/bash", ["-c", script])
    assert result.exit_code == 0, result
    return result.stdout


async def deletes_by_api(harness: Harness, sandbox_id: str) -> int:
    path = f"/v1/sandboxes/{sandbox_id}"
    requests = await harness.emulator.admin.requests()
    return sum(1 for r in requests if r["method"] == "DELETE" and r["path"] == path)


async def acquire_and_kill_the_guard(harness: Harness, deadline: float) -> str:
    """A lease with ``deadline`` whose guard was killed inside the sandbox (as root could)."""
    lease = await harness.methods.acquire(acquire_params(harness, deadline))
    sandbox_id: str = lease["providerLeaseId"]
    await sh(harness, sandbox_id, f'kill -9 "$(cat {PID_FILE})"')
    return sandbox_id


async def assert_deleted_by_the_worker(harness: Harness, sandbox_id: str) -> None:
    """One API delete of the sandbox (the guard asks the agent instead), its row dropped."""
    assert await deletes_by_api(harness, sandbox_id) == 1
    journal = harness.methods.runtime.journal
    assert not await anyio.to_thread.run_sync(journal.is_expiring, sandbox_id)


async def test_deadline_in_the_past_or_too_close_is_refused_before_any_request(
    harness: Harness,
) -> None:
    before = await harness.request_count()
    with pytest.raises(RequestRefused, match="in the past"):
        await harness.methods.acquire(acquire_params(harness, time.time() - 1))
    with pytest.raises(RequestRefused, match=r"only .* s ahead"):
        await harness.methods.acquire(acquire_params(harness, time.time() + 5))
    with pytest.raises(RequestRefused, match="ISO 8601"):
        await harness.methods.acquire({**harness.acquire_params(), "requestedExpiresAt": "soon"})
    assert await harness.request_count() == before
    assert MIN_LEAD_SECONDS == 15.0


async def test_the_guard_alone_deletes_the_sandbox_at_the_deadline(harness: Harness) -> None:
    deadline = time.time() + 20
    before = await harness.request_count()
    started = time.monotonic()
    lease = await harness.methods.acquire(acquire_params(harness, deadline))
    confirmed = time.monotonic() - started
    sandbox_id = lease["providerLeaseId"]
    assert lease["expiresAt"] == iso(deadline)
    assert lease["metadata"]["reuseLease"] is False
    assert await harness.request_count() - before == 2  # create, the exec that starts the guard
    harness.methods.runtime.background.cancel()  # the worker's line is gone: the guard alone
    gone_at = await wait_gone(harness, sandbox_id, within=40)
    assert gone_at >= deadline - 1  # not before the deadline (the guard reads whole seconds)
    history = await harness.emulator.admin.self_history()
    assert [(h["sandbox_id"], h["action"], h["reason"]) for h in history] == [
        (sandbox_id, "delete", "lease-expired")
    ]
    assert await deletes_by_api(harness, sandbox_id) == 0
    print(
        f"\nacquire to guard confirmed {confirmed:.2f} s; guard alone: gone "
        f"{gone_at - deadline:.2f} s after the deadline"
    )


async def test_the_worker_alone_deletes_the_sandbox_when_the_guard_is_killed(
    harness: Harness,
) -> None:
    deadline = time.time() + 20
    sandbox_id = await acquire_and_kill_the_guard(harness, deadline)
    gone_at = await wait_gone(harness, sandbox_id, within=40)
    assert gone_at >= deadline
    await harness.settle()  # the worker's line finishes: confirmed, its row dropped
    assert await harness.emulator.admin.self_history() == []
    await assert_deleted_by_the_worker(harness, sandbox_id)
    print(f"\nworker alone: gone {gone_at - deadline:.2f} s after the deadline")


@asynccontextmanager
async def restarted_worker(harness: Harness) -> AsyncIterator[DriverService]:
    """The harness's worker stops (its background jobs, the worker's line, are cancelled) and a
    new one starts on the same journal, with no lease in memory."""
    old = harness.methods.runtime
    old.background.cancel()
    runtime = DriverRuntime(client_factory=unpaced_client, environ={}, journal=old.journal)

    async def log(level: str, message: str, meta: dict[str, Any] | None = None) -> None:
        pass

    async def notify(method: str, params: dict[str, Any]) -> None:
        pass

    async with runtime.background.running():
        yield DriverService(runtime, notify=notify, log=log, reaper=Reaper(runtime, log))


async def first_call(harness: Harness, worker: DriverService) -> None:
    """Any call with the lease's origin and key: a disposable acquire, then its release."""
    probe = await worker.acquire(harness.acquire_params(workspace=False))
    await worker.release(harness.lease_ref(probe))


async def test_a_restarted_worker_deletes_an_expired_lease_at_its_first_call(
    harness: Harness,
) -> None:
    deadline = time.time() + MIN_LEAD_SECONDS + 1
    sandbox_id = await acquire_and_kill_the_guard(harness, deadline)
    harness.methods.runtime.background.cancel()  # the worker stops: neither line is left
    await anyio.sleep(max(0.0, deadline - time.time()) + 0.5)  # the deadline passes
    assert sandbox_id in await sandbox_ids(harness)
    async with restarted_worker(harness) as worker:
        before = await harness.request_count()
        probe = await worker.acquire(harness.acquire_params(workspace=False))
        requests = (await harness.emulator.admin.requests())[before:]
        assert (requests[0]["method"], requests[0]["path"]) == (
            "DELETE",
            f"/v1/sandboxes/{sandbox_id}",
        )  # deleted first, before the call's own work
        assert sandbox_id not in await sandbox_ids(harness)
        await worker.release(harness.lease_ref(probe))
    await assert_deleted_by_the_worker(harness, sandbox_id)


async def test_a_worker_restarted_before_the_deadline_draws_its_line_at_its_first_call(
    harness: Harness,
) -> None:
    deadline = time.time() + MIN_LEAD_SECONDS + 3
    sandbox_id = await acquire_and_kill_the_guard(harness, deadline)
    async with restarted_worker(harness) as worker:
        await first_call(harness, worker)
        assert sandbox_id in await sandbox_ids(harness)  # not before its deadline
        gone_at = await wait_gone(harness, sandbox_id, within=40)
        await worker.runtime.background.wait_idle()
    assert gone_at >= deadline
    await assert_deleted_by_the_worker(harness, sandbox_id)


async def test_a_guard_that_cannot_reach_the_agent_fails_the_acquire_and_leaves_nothing(
    harness: Harness,
) -> None:
    await harness.emulator.admin.settings(guest_agent=False)
    before = await sandbox_ids(harness)
    with pytest.raises(ProviderError, match="in-guest agent") as caught:
        await harness.methods.acquire(acquire_params(harness, time.time() + 60))
    assert "deleted" in str(caught.value)
    assert await sandbox_ids(harness) == before


async def test_release_deletes_a_lease_with_a_deadline_and_forgets_it(harness: Harness) -> None:
    lease = await harness.methods.acquire(acquire_params(harness, time.time() + 60))
    sandbox_id = lease["providerLeaseId"]
    receipt = await harness.methods.release(harness.lease_ref(lease, reuseLease=True))
    assert receipt == {"providerLeaseId": sandbox_id, "state": "destroyed"}
    assert sandbox_id not in await sandbox_ids(harness)
    journal = harness.methods.runtime.journal
    assert not await anyio.to_thread.run_sync(journal.is_expiring, sandbox_id)


async def test_a_worker_starting_after_the_deadline_deletes_what_its_own_key_can_reach(
    harness: Harness,
) -> None:
    """The official endpoint with the worker's own CREATEOS_API_KEY is known without a call
    (here the client of that endpoint is pointed at the emulator); any other origin waits."""
    other = await harness.methods.acquire(harness.acquire_params(workspace=False))
    official = await harness.methods.acquire(harness.acquire_params(workspace=False))
    journal = harness.methods.runtime.journal
    config = parse_config({"shape": "s-1vcpu-1gb"})
    key_hash = BoundCall(config, "test-key", "", "").scope("").key_hash
    past = time.time() - 1
    await anyio.to_thread.run_sync(
        journal.add_expiring, config.api_url, key_hash, official["providerLeaseId"], past
    )
    await anyio.to_thread.run_sync(
        journal.add_expiring,
        harness.emulator.base_url,
        key_hash,
        other["providerLeaseId"],
        past,
    )

    def to_emulator(config: EnvironmentConfig, api_key: str) -> CreateOSClient:
        return unpaced_client(
            config.model_copy(update={"api_url": harness.emulator.base_url}), api_key
        )

    runtime = DriverRuntime(
        client_factory=to_emulator, environ={"CREATEOS_API_KEY": "test-key"}, journal=journal
    )
    async with runtime.background.running():
        await delete_expired_at_start(runtime)
    left = await sandbox_ids(harness)
    assert official["providerLeaseId"] not in left
    assert other["providerLeaseId"] in left  # its origin's key comes with a call only
    assert not await anyio.to_thread.run_sync(journal.is_expiring, official["providerLeaseId"])
    runtime_without_key = DriverRuntime(client_factory=to_emulator, environ={}, journal=journal)
    before = await harness.request_count()
    await delete_expired_at_start(runtime_without_key)
    assert await harness.request_count() == before
