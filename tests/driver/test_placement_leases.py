"""Egress, rootfs per adapter and the warm window through the real driver on the emulator
(docs/protocol.md 2.9-2.11, checklist 61-64, 66-67)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from provider.errors import RequestRefused
from tests.driver.conftest import Harness
from tests.driver.stream_helpers import token_carriers

pytestmark = pytest.mark.anyio


def api(h: Harness) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=h.emulator.base_url, headers={"X-Api-Key": "test-key"})


async def sandbox_view(h: Harness, lease: dict[str, Any]) -> dict[str, Any]:
    async with api(h) as client:
        answer = await client.get(f"/v1/sandboxes/{lease['providerLeaseId']}")
    return dict(answer.json()["data"])


async def egress_of(h: Harness, lease: dict[str, Any]) -> list[str]:
    async with api(h) as client:
        answer = await client.get(f"/v1/sandboxes/{lease['providerLeaseId']}/egress")
    return list(answer.json()["data"]["egress"])


def grants(fqdns: list[str] | None = None, cidrs: list[str] | None = None) -> dict[str, Any]:
    egress: dict[str, Any] = {}
    if fqdns is not None:
        egress["allowFqdns"] = fqdns
    if cidrs is not None:
        egress["allowCidrs"] = cidrs
    return {"networkEgress": egress}


async def acquire(h: Harness, *, settings: Any = None, **config: Any) -> dict[str, Any]:
    params = h.acquire_params(**config)
    if settings is not None:
        params["executionWorkspaceSettings"] = settings
    lease: dict[str, Any] = await h.methods.acquire(params)
    await h.settle()
    return lease


async def test_base_list_and_run_grants_make_the_effective_egress(harness: Harness) -> None:
    h = harness
    lease = await acquire(
        h,
        egressAllowlist=["github.com"],
        settings=grants(["pypi.org"], ["8.8.8.0/24"]),
    )
    meta = lease["metadata"]
    assert meta["baseEgressAllowlist"] == ["github.com"]
    assert meta["effectiveEgressAllowlist"] == ["github.com", "pypi.org", "8.8.8.0/24"]
    assert await egress_of(h, lease) == ["github.com", "pypi.org", "8.8.8.0/24"]

    star = await acquire(h, egressAllowlist=["*"], settings=grants(["pypi.org"]))
    assert star["metadata"]["effectiveEgressAllowlist"] == ["pypi.org"]
    assert await egress_of(h, star) == ["pypi.org"]

    open_lease = await acquire(h)
    assert open_lease["metadata"]["effectiveEgressAllowlist"] == []
    assert await egress_of(h, open_lease) == []  # no egress field was sent: allow all


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"networkEgress": "github.com"}, "networkEgress must be an object"),
        ({"networkEgress": ["github.com"]}, "networkEgress must be an object"),
        (grants(["ok.example", "bad..host"]), r"networkEgress\.allowFqdns\[1\]"),
        (grants(cidrs=["10.0.0.1/8"]), r"networkEgress\.allowCidrs\[0\]"),
        (grants(cidrs="10.0.0.0/8"), "allowCidrs must be an array"),  # type: ignore[arg-type]
        ("not an object", "executionWorkspaceSettings must be an object"),
    ],
)
async def test_a_malformed_grant_fails_acquire_before_any_request(
    harness: Harness, settings: Any, message: str
) -> None:
    h = harness
    count = await h.request_count()
    with pytest.raises(RequestRefused, match=message) as caught:
        await acquire(h, settings=settings)
    assert "bad..host" not in str(caught.value)
    assert await h.request_count() == count


async def test_resume_reapplies_the_stored_egress_before_resuming(harness: Harness) -> None:
    h = harness
    config: dict[str, Any] = {"reuseLease": True, "egressAllowlist": ["github.com"]}
    lease = await acquire(h, settings=grants(["pypi.org"]), **config)
    await h.methods.release(h.lease_ref(lease, **config))
    async with api(h) as client:  # someone widened it meanwhile
        await client.put(f"/v1/sandboxes/{lease['providerLeaseId']}/egress", json={"egress": ["*"]})
    since = await h.request_count()
    resumed = await h.methods.resume(h.lease_ref(lease, **config))
    assert resumed["providerLeaseId"] == lease["providerLeaseId"]
    requests = (await h.emulator.admin.requests())[since:]
    calls = [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in requests]
    put = calls.index(("PUT", "egress"))
    assert calls[0][0] == "GET" and put == 1
    assert ("POST", "resume") in calls and calls.index(("POST", "resume")) > put
    assert await egress_of(h, lease) == ["github.com", "pypi.org"]


@pytest.mark.parametrize("stored", [["github.com", "bad rule"], "github.com", None])
async def test_a_stored_egress_list_that_fails_the_grammar_is_gone_without_a_request(
    harness: Harness, stored: Any
) -> None:
    h = harness
    config: dict[str, Any] = {"reuseLease": True, "egressAllowlist": ["github.com"]}
    lease = await acquire(h, **config)
    await h.methods.release(h.lease_ref(lease, **config))
    tampered = {**lease, "metadata": {**lease["metadata"], "effectiveEgressAllowlist": stored}}
    since = await h.request_count()
    resumed = await h.methods.resume(h.lease_ref(tampered, **config))
    assert resumed == {"providerLeaseId": None, "metadata": {"expired": True}}
    assert await h.request_count() == since


async def test_rootfs_per_adapter_is_chosen_recorded_and_checked_on_resume(
    harness: Harness,
) -> None:
    h = harness
    by_adapter = {"codex_local": "ubuntu:26.04"}
    config: dict[str, Any] = {"reuseLease": True, "rootfsByAdapter": by_adapter}
    codex = await h.methods.acquire({**h.acquire_params(**config), "adapterType": "codex_local"})
    other = await h.methods.acquire({**h.acquire_params(**config), "adapterType": "claude_local"})
    await h.settle()
    assert codex["metadata"]["rootfs"] == "ubuntu:26.04"
    assert codex["metadata"]["adapterType"] == "codex_local"
    assert other["metadata"]["rootfs"] is None and other["metadata"]["adapterType"] == (
        "claude_local"
    )
    assert (await sandbox_view(h, codex))["rootfs"] == "ubuntu:26.04"
    for lease in (codex, other):
        await h.methods.release(h.lease_ref(lease, **config))
    count = await h.request_count()
    changes: list[dict[str, Any]] = [
        {**config, "rootfsByAdapter": {"codex_local": "debian:13"}},  # the map entry changed
        {**config, "egressAllowlist": ["github.com"]},  # the base egress list changed
        {**config, "autoPauseAfterSeconds": 600},  # the window changed
    ]
    for changed in changes:
        gone = await h.methods.resume(h.lease_ref(codex, **changed))
        assert gone == {"providerLeaseId": None, "metadata": {"expired": True}}
    bad_adapter = h.lease_ref(codex, **config)
    bad_adapter["leaseMetadata"] = {**codex["metadata"], "adapterType": 7}
    assert (await h.methods.resume(bad_adapter))["providerLeaseId"] is None
    assert await h.request_count() == count
    resumed = await h.methods.resume(h.lease_ref(codex, **config))
    assert resumed["providerLeaseId"] == codex["providerLeaseId"]


async def test_a_disposable_lease_has_no_window_and_is_deleted(harness: Harness) -> None:
    h = harness
    config: dict[str, Any] = {"reuseLease": True, "autoPauseAfterSeconds": 600}
    lease = await h.acquire(workspace=False, **config)
    assert lease["metadata"]["reuseLease"] is False
    assert lease["metadata"]["autoPauseAfterSeconds"] is None
    assert "auto_pause_after_seconds" not in await sandbox_view(h, lease)
    receipt = await h.methods.release(h.lease_ref(lease, **config))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}


async def test_a_warm_release_kills_every_live_tree_and_leaves_the_sandbox_running(
    harness: Harness,
) -> None:
    h = harness
    config: dict[str, Any] = {"reuseLease": True, "autoPauseAfterSeconds": 600}
    lease = await h.acquire(**config)
    assert lease["metadata"]["autoPauseAfterSeconds"] == 600
    assert (await sandbox_view(h, lease))["auto_pause_after_seconds"] == 600
    daemon = await h.methods.execute(
        {
            **h.with_lease(lease, **config),
            "command": "bash",
            "args": ["-c", "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo started"],
        }
    )
    assert daemon["stdout"] == "started\n"
    assert any("sleep 1000" in line for line in await token_carriers(h, lease))
    since = await h.request_count()
    receipt = await h.methods.release(h.lease_ref(lease, **config))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "stopped"}
    calls = [(r["method"], r["path"]) for r in (await h.emulator.admin.requests())[since:]]
    assert not any(path.endswith("/pause") for _, path in calls)
    assert ("POST", f"/v1/sandboxes/{lease['providerLeaseId']}/exec") in calls  # the sweep
    assert (await sandbox_view(h, lease))["status"] == "running"
    assert await token_carriers(h, lease) == []


async def test_a_failed_kill_refuses_the_warm_release_and_destroy_still_deletes(
    harness: Harness,
) -> None:
    h = harness
    config: dict[str, Any] = {"reuseLease": True, "autoPauseAfterSeconds": 600}
    lease = await h.acquire(**config)
    await h.methods.execute(
        {
            **h.with_lease(lease, **config),
            "command": "bash",
            "args": ["-c", "setsid sleep 1000 </dev/null >/dev/null 2>&1 &"],
        }
    )
    await h.emulator.admin.add_fault("POST", r"/exec$", status=500)  # the sweep's kill
    with pytest.raises(RequestRefused, match=r"(?i)destroy"):
        await h.methods.release(h.lease_ref(lease, **config))
    await h.emulator.admin.clear_faults()
    receipt = await h.methods.destroy(h.lease_ref(lease, **config))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}
    assert (await h.emulator.admin.state())["sandboxes"] == []  # deleted
