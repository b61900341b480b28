"""Deadlines spent in the rate-limit queue (issue 21, item 1): a request that never left the
pacer's queue created nothing, so its call fails with the queue error (not "outcome unknown"),
the lease stays usable, and an acquire storm leaves no sandbox billing once the worker's own
background search has settled. Real emulator, real default pacing (250 ms, burst
:data:`~provider.createos.pacer.CAPACITY`): each storm is larger than the burst."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from provider.config import EnvironmentConfig
from provider.createos.client import CreateOSClient
from provider.createos.pacer import CAPACITY, RequestPacer
from provider.errors import ProviderError, RateLimitQueued
from tests.driver.conftest import Harness

pytestmark = pytest.mark.anyio


def pace(h: Harness) -> None:
    """From here on every client of the worker shares one pacer at the default pace."""
    pacer = RequestPacer(h.emulator.base_url, shared_dir=None)

    def paced(config: EnvironmentConfig, api_key: str) -> CreateOSClient:
        return CreateOSClient(config.api_url, api_key, pacer=pacer)

    h.methods.runtime.client_factory = paced


async def gather(count: int, call: Any) -> list[Any]:
    """``call(i)`` for i in range(count), all at once: each result, or the ProviderError."""
    outcomes: list[Any] = [None] * count

    async def one(i: int) -> None:
        try:
            outcomes[i] = await call(i)
        except ProviderError as exc:
            outcomes[i] = exc

    async with anyio.create_task_group() as group:
        for i in range(count):
            group.start_soon(one, i)
    return outcomes


async def live_sandboxes(h: Harness) -> list[str]:
    state = await h.emulator.admin.state()
    return [s["id"] for s in state["sandboxes"] if s["status"] not in ("destroyed", "destroying")]


STORM = CAPACITY + 40
"""Commands at once: a burst's worth go out at once, the rest must wait in the queue."""


async def test_a_storm_of_short_commands_at_default_pacing_poisons_nothing(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire(workspace=False)
    sandbox_id = lease["providerLeaseId"]
    pace(h)
    before = len(await h.emulator.admin.requests())

    async def echo(i: int) -> dict[str, Any]:
        params = {**h.with_lease(lease), "command": "echo", "args": [str(i)], "timeoutMs": 3000}
        result: dict[str, Any] = await h.methods.execute(params)
        return result

    with anyio.fail_after(120):
        outcomes = await gather(STORM, echo)
    ran = [o for o in outcomes if isinstance(o, dict)]
    queued = [o for o in outcomes if isinstance(o, RateLimitQueued)]
    others = [repr(o) for o in outcomes if not isinstance(o, dict | RateLimitQueued)]
    assert not others, others
    assert ran and queued  # the storm did fill the queue
    assert "rate-limit queue" in str(queued[0]) and "nothing was sent" in str(queued[0])
    execs = [
        r
        for r in (await h.emulator.admin.requests())[before:]
        if r["method"] == "POST" and r["path"] == f"/v1/sandboxes/{sandbox_id}/exec"
    ]
    assert len(execs) == len(ran)  # one request a command, none for those that never left
    with anyio.fail_after(60):  # not poisoned: the lease still runs commands
        after = await h.methods.execute({**h.with_lease(lease), "command": "echo", "args": ["ok"]})
    assert after["stdout"] == "ok\n"
    await h.methods.destroy(h.lease_ref(lease))


async def test_an_acquire_storm_leaves_no_sandbox_billing(harness: Harness) -> None:
    h = harness
    pace(h)

    async def acquire(i: int) -> dict[str, Any]:
        params = {**h.acquire_params(workspace=False, timeoutMs=3000), "runId": f"run-{i}"}
        lease: dict[str, Any] = await h.methods.acquire(params)
        return lease

    with anyio.fail_after(120):
        outcomes = await gather(20, acquire)
    leases = [o for o in outcomes if isinstance(o, dict)]
    assert all(isinstance(o, dict | ProviderError) for o in outcomes)
    kept = {lease["providerLeaseId"] for lease in leases}
    # Creates cut on the wire may land after their call; the worker's own background search
    # deletes them, with no later call of this origin and key to trigger recovery. Poll the
    # emulator, bounded.
    with anyio.fail_after(90):
        while set(await live_sandboxes(h)) != kept:
            await anyio.sleep(0.5)
    for lease in leases:
        await h.methods.destroy(h.lease_ref(lease, timeoutMs=30_000))
