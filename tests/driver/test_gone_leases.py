"""Calls on a lease whose sandbox is gone cost no request (issue 21, item 11): after a release
without reuse, a destroy or a 404 for the sandbox, executes and syncs are refused at once with
LeaseGone, also after a worker restart (the journal remembers); a reuse release is not gone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from provider.createos.errors import NotFound
from provider.driver.core.gone import RELEASED, GoneLeases
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.runtime import DriverRuntime
from provider.driver.core.tracker import ScopeKey
from provider.driver.service import DriverService
from provider.errors import LeaseGone
from tests.driver.conftest import Harness, unpaced_client

pytestmark = pytest.mark.anyio


async def refused_without_requests(h: Harness, methods: DriverService, call: dict[str, Any]) -> str:
    """Run 100 executes of ``call``: each refused as gone, none reaching CreateOS."""
    before = await h.request_count()
    messages = set()
    for _ in range(100):
        with pytest.raises(LeaseGone) as refused:
            await methods.execute(call)
        messages.add(str(refused.value))
    assert await h.request_count() == before
    assert len(messages) == 1
    return messages.pop()


async def test_executes_on_a_released_lease_cost_nothing_even_after_a_restart(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire(workspace=False)
    sandbox_id = lease["providerLeaseId"]
    receipt = await h.methods.release(h.lease_ref(lease))
    assert receipt == {"providerLeaseId": sandbox_id, "state": "destroyed"}
    call = {**h.with_lease(lease), "command": "echo", "args": ["hi"]}
    message = await refused_without_requests(h, h.methods, call)
    assert (
        f"This lease is gone: its sandbox {sandbox_id} was deleted when the lease was released"
        in message
    )
    before = await h.request_count()
    assert await h.methods.release(h.lease_ref(lease)) == receipt  # idempotent, no request
    assert await h.methods.resume(h.lease_ref(lease)) == {
        "providerLeaseId": None,
        "metadata": {"expired": True},
    }
    sync = {**h.with_lease(lease), "operations": []}
    with pytest.raises(LeaseGone):
        await h.methods.sync_out(sync)
    assert await h.request_count() == before

    # A restarted worker: new memory, the same journal.
    journal = LeaseJournal(tmp_path / "state" / "leases.sqlite3")
    runtime = DriverRuntime(client_factory=unpaced_client, environ={}, journal=journal)

    async def ignore(*args: Any) -> None:
        return None

    restarted = DriverService(runtime, notify=ignore, log=ignore)
    assert await refused_without_requests(h, restarted, call) == message


async def test_a_sandbox_answered_404_is_gone_after_one_request(harness: Harness) -> None:
    h = harness
    acquired = await h.acquire(workspace=False)
    lease = {**acquired, "providerLeaseId": "sb_01UNKNOWN0000000000000000"}  # never existed
    call = {**h.with_lease(lease), "command": "echo", "args": ["hi"]}
    with pytest.raises(NotFound):
        await h.methods.execute(call)
    message = await refused_without_requests(h, h.methods, call)
    assert "no longer exists (CreateOS answered 404 for it)" in message
    before = await h.request_count()
    receipt = await h.methods.destroy(h.lease_ref(lease))  # a 404 alone: the delete still goes
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}
    assert await h.request_count() > before
    await h.methods.destroy(h.lease_ref(acquired))


async def test_a_reuse_release_is_not_gone(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    receipt = await h.methods.release(h.lease_ref(lease, reuseLease=True))
    assert receipt is not None and receipt["state"] == "stopped"
    resumed = await h.methods.resume(h.lease_ref(lease, reuseLease=True))
    assert resumed["providerLeaseId"] == lease["providerLeaseId"]
    ran = await h.methods.execute(
        {**h.with_lease(resumed, reuseLease=True), "command": "echo", "args": ["again"]}
    )
    assert ran["stdout"] == "again\n"
    await h.methods.destroy(h.lease_ref(resumed, reuseLease=True))


async def test_the_memory_of_gone_sandboxes_expires_and_stays_bounded() -> None:
    now = [1_000_000.0]
    journal = LeaseJournal(None)
    gone = GoneLeases(journal, cap=2, ttl=60.0, clock=lambda: now[0])
    scopes = [
        ScopeKey.build(
            company_id="c",
            environment_id="e",
            api_url="http://api",
            api_key="k",
            lease_id=f"sb_{i}",
        )
        for i in range(3)
    ]
    for scope in scopes:
        await gone.mark(scope, RELEASED)
    assert len(gone._memory) == 2  # bounded: the oldest left the memory ...
    assert await gone.reason(scopes[0]) == RELEASED  # ... and the journal still knows it
    now[0] = time.time() + 61  # past the TTL, for the memory and the journal rows alike
    assert [await gone.reason(scope) for scope in scopes] == [None, None, None]
