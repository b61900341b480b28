"""Reuse and the reaper against the emulator (docs/protocol.md 2.10.1, 2.3.3, 2.13).

Checklist 66 and 91-94: only leases of an execution workspace are kept, every create carries
the scope tag, and the sweep after a reusable acquire or a kept release deletes this
environment's idle or surplus paused sandboxes, off the call's path and never anything else.
Kept sandboxes and decoys are made straight through the emulator's public API; the harness's
fake clock drives the once-a-minute rule and the idle bound.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from provider.config import parse_config
from provider.createos.client import CreateOSClient
from provider.driver.commands.sandbox_ops import transition
from provider.driver.core.names import name_token, scope_tag
from tests.driver.conftest import Harness, unpaced_client

pytestmark = pytest.mark.anyio

GONE = {"providerLeaseId": None, "metadata": {"expired": True}}
NAME_RE = r"pc-([0-9a-f]{12})-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}"


@asynccontextmanager
async def api_client(h: Harness, key: str = "test-key") -> AsyncIterator[CreateOSClient]:
    async with unpaced_client(parse_config(h.config(apiKey=key)), key) as client:
        yield client


async def kept_sandbox(client: CreateOSClient, name: str) -> str:
    """A paused sandbox named ``name``, made through the public API."""
    sandbox_id = await client.create_sandbox(
        shape="s-1vcpu-1gb", name=name, rootfs=None, region=None
    )
    await transition(client, sandbox_id, "running")
    await transition(client, sandbox_id, "paused")
    return sandbox_id


async def statuses(h: Harness) -> dict[str, str]:
    """Status of every live sandbox (destroyed ones are absent)."""
    return {s["id"]: s["status"] for s in (await h.emulator.admin.state())["sandboxes"]}


async def names(h: Harness) -> dict[str, str]:
    return {s["id"]: s["name"] for s in (await h.emulator.admin.state())["sandboxes"]}


async def requests(h: Harness, since: int = 0) -> list[dict[str, Any]]:
    return (await h.emulator.admin.requests())[since:]


def lists(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in log if r["method"] == "GET" and r["path"] == "/v1/sandboxes"]


def deletes(log: list[dict[str, Any]]) -> set[str]:
    return {r["path"].rsplit("/", 1)[1] for r in log if r["method"] == "DELETE"}


def tag_of(h: Harness) -> str:
    return scope_tag(h.company_id, h.environment_id, h.emulator.base_url)


async def keep(h: Harness, **config: Any) -> dict[str, Any]:
    """Acquire a reusable lease and release it (kept: paused)."""
    lease = await h.acquire(reuseLease=True, **config)
    receipt = await h.methods.release(h.lease_ref(lease, reuseLease=True, **config))
    await h.settle()
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "stopped"}
    return lease


# -- 66: only an execution workspace's lease is kept ------------------------------------------


@pytest.mark.parametrize(
    "ids",
    [
        {},
        {"agentId": "agent-1"},
        {"executionWorkspaceId": "workspace-1"},
        {"agentId": "agent-1", "executionWorkspaceId": ""},
        {"agentId": None, "executionWorkspaceId": "workspace-1"},
        {"agentId": 7, "executionWorkspaceId": "workspace-1"},
    ],
)
async def test_reuse_without_an_execution_workspace_gives_a_disposable_lease(
    harness: Harness, ids: dict[str, Any]
) -> None:
    h = harness
    lease = await h.methods.acquire({**h.acquire_params(workspace=False, reuseLease=True), **ids})
    await h.settle()
    assert lease["metadata"]["reuseLease"] is False
    receipt = await h.methods.release(h.lease_ref(lease, reuseLease=True))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}
    assert lease["providerLeaseId"] not in await statuses(h)
    assert lists(await requests(h)) == []  # a disposable lease never sweeps


async def test_a_reusable_lease_is_kept_only_while_the_config_still_reuses(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    assert lease["metadata"]["reuseLease"] is True
    receipt = await h.methods.release(h.lease_ref(lease, reuseLease=False))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}
    plain = await h.acquire(reuseLease=False)
    assert plain["metadata"]["reuseLease"] is False
    receipt = await h.methods.release(h.lease_ref(plain, reuseLease=True))  # issued disposable
    assert receipt == {"providerLeaseId": plain["providerLeaseId"], "state": "destroyed"}


# -- 91: the name tag ------------------------------------------------------------------------


async def test_every_create_carries_the_scope_tag_and_no_secret(harness: Harness) -> None:
    h = harness
    other_company = dataclasses.replace(h, company_id="company-2")
    other_env = dataclasses.replace(h, environment_id="env-2")
    same = [
        await h.acquire(),
        await h.acquire(),
        await h.acquire(apiUrl=h.emulator.base_url + "/v1/"),  # the same origin, normalized
        await h.acquire(apiKey="other-key"),  # another key: the tag cannot depend on it
    ]
    different = [await other_company.acquire(), await other_env.acquire()]
    probe = await h.methods.probe(h.call())
    assert probe["ok"] is True
    by_id = await names(h)
    tags = [re.fullmatch(NAME_RE, by_id[lease["providerLeaseId"]]) for lease in same + different]
    assert all(tags)
    expected = hashlib.sha256(
        f"{h.company_id}\n{h.environment_id}\n{h.emulator.base_url}".encode()
    ).hexdigest()[:12]
    assert {m.group(1) for m in tags[:4] if m} == {expected}
    assert {m.group(1) for m in tags[4:] if m} == {
        tag_of(other_company),
        tag_of(other_env),
    }
    assert len({tag_of(other_company), tag_of(other_env), expected}) == 3
    for name in by_id.values():
        for key in ("test-key", "other-key"):
            assert key not in name
            assert hashlib.sha256(key.encode()).hexdigest()[:12] not in name


# -- 92: the sweep -----------------------------------------------------------------------------


async def test_a_sixth_kept_lease_makes_the_oldest_go_and_idle_ones_follow(
    harness: Harness,
) -> None:
    h = harness
    url = h.emulator.base_url
    await h.emulator.admin.settings(pause_delay_ms=0)
    async with api_client(h) as client:
        mine = [await kept_sandbox(client, name_token(tag_of(h))) for _ in range(5)]
        decoys = [
            await kept_sandbox(client, name_token(scope_tag(h.company_id, "env-2", url))),
            await kept_sandbox(client, name_token(scope_tag("company-2", h.environment_id, url))),
            await kept_sandbox(client, "my-own-sandbox"),
        ]
        warm = await client.create_sandbox(
            shape="s-1vcpu-1gb", name=name_token(tag_of(h)), rootfs=None, region=None
        )
    since = len(await requests(h))

    sixth = await h.acquire(reuseLease=True)  # first sweep: five kept, within the cap
    sixth_id = sixth["providerLeaseId"]
    await h.methods.release(h.lease_ref(sixth, reuseLease=True))  # inside the minute: no sweep
    await h.settle()
    assert len(lists(await requests(h, since))) == 1
    live = await statuses(h)
    assert all(live[s] == "paused" for s in [*mine, *decoys, sixth_id])

    h.clock.advance(61)
    seventh = await h.acquire(reuseLease=True)  # six kept: the oldest goes
    live = await statuses(h)
    assert mine[0] not in live
    assert all(live[s] == "paused" for s in [*mine[1:], *decoys, sixth_id])
    assert live[warm] == "running" and live[seventh["providerLeaseId"]] == "running"
    deleted = f"Deleted kept CreateOS sandbox {mine[0]} of this environment (over the cap)."
    assert ("info", deleted) in h.logs

    h.clock.advance(86_401)  # past reuseMaxIdleSeconds (default one day)
    await h.methods.release(h.lease_ref(seventh, reuseLease=True))
    await h.settle()
    live = await statuses(h)
    assert not {*mine, sixth_id} & set(live)
    assert live[seventh["providerLeaseId"]] == "paused"  # the lease just kept stays
    assert all(live[s] == "paused" for s in decoys) and live[warm] == "running"

    log = await requests(h, since)
    assert deletes(log) == {*mine, sixth_id}
    assert all(r["query"] == "limit=100&offset=0&status=paused" for r in lists(log))
    assert len(lists(log)) == 3
    assert not any("test-key" in message for _, message in h.logs)


async def test_the_sweep_runs_off_the_calls_path(harness: Harness) -> None:
    h = harness
    await h.emulator.admin.add_fault("GET", r"^/v1/sandboxes$", delay_ms=3000)
    lease = await h.methods.acquire(h.acquire_params(reuseLease=True))
    assert lease["metadata"]["reuseLease"] is True
    assert h.methods.runtime.background.active == 1  # answered while the sweep still lists
    assert lists(await requests(h)) == []
    await h.settle()
    assert len(lists(await requests(h))) == 1


async def test_sweeps_run_at_most_once_a_minute_per_environment(harness: Harness) -> None:
    h = harness
    first = await h.acquire(reuseLease=True)
    await h.acquire(reuseLease=True)
    await h.methods.release(h.lease_ref(first, reuseLease=True))
    await h.settle()
    assert len(lists(await requests(h))) == 1
    await dataclasses.replace(h, environment_id="env-2").acquire(reuseLease=True)
    assert len(lists(await requests(h))) == 2  # another environment sweeps at once
    await h.acquire(reuseLease=False)  # no reuse: never sweeps
    h.clock.advance(59)
    await h.acquire(reuseLease=True)
    assert len(lists(await requests(h))) == 2
    h.clock.advance(2)
    await h.acquire(reuseLease=True)
    assert len(lists(await requests(h))) == 3


async def test_shutdown_cancels_a_running_sweep(harness: Harness) -> None:
    h = harness
    await h.emulator.admin.add_fault("GET", r"^/v1/sandboxes$", delay_ms=5000)
    await h.methods.acquire(h.acquire_params(reuseLease=True))
    assert h.methods.runtime.background.active == 1
    with anyio.fail_after(3):
        await h.methods.shutdown()
        await h.settle()
    assert not h.methods.runtime.background.start_soon(h.settle)  # none accepted after it


async def test_a_lease_resumed_during_a_sweep_is_spared(harness: Harness) -> None:
    h = harness
    first = await keep(h, reuseMaxIdleSeconds=600)
    second = await keep(h, reuseMaxIdleSeconds=600)
    h.clock.advance(601)  # both idle now
    second_id = second["providerLeaseId"]
    await h.emulator.admin.add_fault("GET", f"^/v1/sandboxes/{second_id}$", delay_ms=3000)
    resumed: list[dict[str, Any]] = []

    async def resume() -> None:
        ref = h.lease_ref(second, reuseLease=True, reuseMaxIdleSeconds=600)
        resumed.append(await h.methods.resume(ref))

    async with anyio.create_task_group() as tg:
        tg.start_soon(resume)
        await anyio.wait_all_tasks_blocked()  # the resume is waiting for its first read
        await h.acquire(reuseLease=True, reuseMaxIdleSeconds=600)  # sweeps while it waits
    assert resumed[0]["providerLeaseId"] == second_id
    live = await statuses(h)
    assert first["providerLeaseId"] not in live and live[second_id] == "running"
    assert second_id not in deletes(await requests(h))


# -- 93: a failing delete ----------------------------------------------------------------------


async def test_a_failing_delete_is_logged_and_fails_nothing(harness: Harness) -> None:
    h = harness
    config: dict[str, Any] = {"reuseLease": True, "reuseMaxKeptSandboxes": 1}
    async with api_client(h) as client:
        stuck, second, third = [await kept_sandbox(client, name_token(tag_of(h))) for _ in "abc"]
    await h.emulator.admin.add_fault("DELETE", f"^/v1/sandboxes/{stuck}$", status=500, times=50)

    lease = await h.acquire(**config)  # sweep: three kept, cap one
    assert lease["metadata"]["reuseLease"] is True
    live = await statuses(h)
    assert live[stuck] == "paused" and second not in live and live[third] == "paused"
    warnings = [message for level, message in h.logs if level == "warn"]
    assert len(warnings) == 1 and stuck in warnings[0] and "500" in warnings[0]

    h.clock.advance(61)
    receipt = await h.methods.release(h.lease_ref(lease, **config))  # sweep: the same delete fails
    await h.settle()
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "stopped"}
    live = await statuses(h)
    assert live[stuck] == "paused" and third not in live
    assert live[lease["providerLeaseId"]] == "paused"
    assert len([level for level, _ in h.logs if level == "warn"]) == 2
    assert not any("test-key" in message for _, message in h.logs)


async def test_a_failing_list_is_logged_and_fails_nothing(harness: Harness) -> None:
    h = harness
    await h.emulator.admin.add_fault("GET", r"^/v1/sandboxes$", status=503, times=50)
    lease = await h.acquire(reuseLease=True)
    assert lease["providerLeaseId"]
    (warning,) = [message for level, message in h.logs if level == "warn"]
    assert "list" in warning and "503" in warning


# -- 94: resume of a reaped lease --------------------------------------------------------------


async def test_resume_of_a_reaped_lease_answers_gone_without_deleting(harness: Harness) -> None:
    h = harness
    config: dict[str, Any] = {"reuseMaxKeptSandboxes": 1}
    reaped = await keep(h, **config)
    await keep(h, **config)
    h.clock.advance(61)
    await h.acquire(reuseLease=True, **config)  # two kept, cap one: the older goes
    assert reaped["providerLeaseId"] not in await statuses(h)
    since = len(await requests(h))
    resumed = await h.methods.resume(h.lease_ref(reaped, reuseLease=True, **config))
    assert resumed == GONE
    assert deletes(await requests(h, since)) == set()


# -- kept forks of a template: no name, known from the journal -------------------------------


async def test_kept_forks_of_a_template_are_bounded_like_named_leases(harness: Harness) -> None:
    h = harness
    config: dict[str, Any] = {"reuseMaxIdleSeconds": 600}
    async with api_client(h) as client:
        template = await kept_sandbox(client, "pc-setup-template")
        decoy, _ = await client.fork_sandbox(  # a fork this worker never kept: not ours
            template, start_paused=True, egress=["*"], ingress_enabled=False
        )
        await transition(client, decoy, "paused")
    fork = await keep(h, snapshot=template, **config)
    fork_id = fork["providerLeaseId"]
    assert fork["metadata"]["snapshot"] == template
    assert not re.fullmatch(NAME_RE, (await names(h))[fork_id])  # a fork takes no name of ours
    journal = h.methods.runtime.journal
    assert fork_id in journal.kept_forks(tag_of(h))

    h.clock.advance(661)  # past the idle bound and the once-a-minute rule
    current = await h.acquire(reuseLease=True, snapshot=template, **config)
    await h.settle()
    live = await statuses(h)
    assert fork_id not in live
    assert live[template] == "paused" and live[decoy] == "paused"
    assert live[current["providerLeaseId"]] == "running"
    assert journal.kept_forks(tag_of(h)) == {current["providerLeaseId"]}

    receipt = await h.methods.destroy(h.lease_ref(current, reuseLease=True, snapshot=template))
    assert receipt is not None and receipt["state"] == "destroyed"
    assert journal.kept_forks(tag_of(h)) == frozenset()


async def test_a_refused_status_filter_still_reaps_and_is_remembered(harness: Harness) -> None:
    h = harness
    await h.emulator.admin.settings(pause_delay_ms=0)
    config: dict[str, Any] = {"reuseMaxKeptSandboxes": 1}
    async with api_client(h) as client:
        older = await kept_sandbox(client, name_token(tag_of(h)))
        newer = await kept_sandbox(client, name_token(tag_of(h)))
    await h.emulator.admin.add_fault("GET", r"^/v1/sandboxes$", status=400, times=1)
    since = len(await requests(h))

    first = await h.acquire(reuseLease=True, **config)  # sweeps: two kept, cap one
    live = await statuses(h)
    assert older not in live and live[newer] == "paused"
    h.clock.advance(61)
    await h.methods.release(h.lease_ref(first, reuseLease=True, **config))  # sweeps again
    await h.settle()
    live = await statuses(h)
    assert newer not in live and live[first["providerLeaseId"]] == "paused"

    queries = [(r["query"], r["status"]) for r in lists(await requests(h, since))]
    assert queries == [
        ("limit=100&offset=0&status=paused", 400),
        ("limit=100&offset=0", 200),
        ("limit=100&offset=0", 200),  # remembered: the filter is not asked for again
    ]
    refused = [m for _, m in h.logs if "refused the status=paused filter" in m]
    assert len(refused) == 1
    assert not [m for level, m in h.logs if level == "warn"]
