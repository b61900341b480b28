"""Lease lifecycle against the emulator: acquire, realize, resume, release, destroy, probe."""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest

from provider.errors import CleanupUnconfirmed, ProviderError, RequestRefused
from tests.driver.conftest import SHAPE, Harness
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio

MARKER_PATH = "/paperclip-workspace/.paperclip-runtime/.paperclip-createos-lease"


async def live_sandboxes(h: Harness) -> list[dict[str, Any]]:
    state = await h.emulator.admin.state()
    return [s for s in state["sandboxes"] if s["status"] not in ("destroyed", "destroying")]


async def status_of(h: Harness, sandbox_id: str) -> str | None:
    for s in (await h.emulator.admin.state())["sandboxes"]:
        if s["id"] == sandbox_id:
            return str(s["status"])
    return None


async def test_full_lifecycle_with_reuse(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    sandbox_id = lease["providerLeaseId"]
    meta = lease["metadata"]
    assert re.fullmatch(r"sb_[0-9A-Z]{26}", sandbox_id)
    assert meta["provider"] == "createos"
    assert meta["apiUrl"] == h.emulator.base_url
    assert meta["companyId"] == h.company_id and meta["environmentId"] == h.environment_id
    assert meta["remoteCwd"] == "/paperclip-workspace"
    assert meta["shape"] == SHAPE and meta["rootfs"] is None and meta["region"] is None
    assert meta["reuseLease"] is True
    assert re.fullmatch(
        r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", meta["marker"]
    )
    assert "test-key" not in repr(lease)
    assert lease["expiresAt"] is None

    realized = await h.methods.realize(
        {**h.with_lease(lease, reuseLease=True), "workspace": {"localPath": "/x"}}
    )
    assert realized["cwd"] == "/paperclip-workspace"

    result = await h.methods.execute(
        {**h.with_lease(lease, reuseLease=True), "command": "pwd", "cwd": "/paperclip-workspace"}
    )
    assert result["exitCode"] == 0 and result["stdout"] == "/paperclip-workspace\n"
    marker = await h.methods.execute(
        {**h.with_lease(lease, reuseLease=True), "command": "cat", "args": [MARKER_PATH]}
    )
    assert marker["stdout"] == meta["marker"]  # exactly 36 characters, no newline

    receipt = await h.methods.release(h.lease_ref(lease, reuseLease=True))
    assert receipt == {"providerLeaseId": sandbox_id, "state": "stopped"}
    assert await status_of(h, sandbox_id) == "paused"

    resumed = await h.methods.resume(h.lease_ref(lease, reuseLease=True))
    assert resumed["providerLeaseId"] == sandbox_id
    assert resumed["metadata"]["resumedLease"] is True
    assert await status_of(h, sandbox_id) == "running"

    receipt = await h.methods.destroy(h.lease_ref(lease, reuseLease=True))
    assert receipt == {"providerLeaseId": sandbox_id, "state": "destroyed"}
    assert await live_sandboxes(h) == []


async def test_release_without_reuse_deletes(harness: Harness) -> None:
    lease = await harness.acquire()
    receipt = await harness.methods.release(harness.lease_ref(lease))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}
    assert await live_sandboxes(harness) == []


async def test_release_uses_current_config_not_metadata(harness: Harness) -> None:
    lease = await harness.acquire(reuseLease=True)
    receipt = await harness.methods.release(harness.lease_ref(lease, reuseLease=False))
    assert receipt is not None and receipt["state"] == "destroyed"


async def test_release_of_null_lease_answers_null_without_http(harness: Harness) -> None:
    before = await harness.request_count()
    assert await harness.methods.release({**harness.call(), "providerLeaseId": None}) is None
    assert await harness.methods.destroy({**harness.call(), "providerLeaseId": ""}) is None
    assert await harness.request_count() == before


async def test_requested_expiry_is_refused_before_any_request(harness: Harness) -> None:
    before = await harness.request_count()
    with pytest.raises(RequestRefused, match="in the past"):
        await harness.methods.acquire(
            {**harness.call(), "runId": "r", "requestedExpiresAt": "2020-01-01T00:00:00Z"}
        )
    assert await harness.request_count() == before


async def test_custom_endpoint_without_key_is_refused_before_any_request(harness: Harness) -> None:
    harness.methods.runtime.environ = {"CREATEOS_API_KEY": "env-key"}
    before = await harness.request_count()
    for url in (
        harness.emulator.base_url,
        "https://api.sb.createos.sh.evil.example",
        "https://api.sb.createos.sh:8443",
        "https://other.example",
    ):
        call = harness.call(apiUrl=url)
        del call["config"]["apiKey"]
        with pytest.raises(ProviderError, match="apiKey"):
            await harness.methods.acquire({**call, "runId": "r"})
    assert await harness.request_count() == before


async def test_foreign_leases_are_refused_without_http(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    before = await h.request_count()
    for field_name, value in (
        ("companyId", "company-2"),
        ("environmentId", "env-2"),
        ("apiUrl", "http://127.0.0.1:9"),
        ("provider", "e2b"),
    ):
        foreign = {**lease, "metadata": {**lease["metadata"], field_name: value}}
        with pytest.raises(RequestRefused):
            await h.methods.execute({**h.with_lease(foreign), "command": "true"})
        with pytest.raises(RequestRefused):
            await h.methods.resume(h.lease_ref(foreign))
        with pytest.raises(RequestRefused):
            await h.methods.destroy(h.lease_ref(foreign))
        with pytest.raises(RequestRefused):
            await h.methods.release(h.lease_ref(foreign))
        with pytest.raises(RequestRefused):
            await h.methods.realize({**h.with_lease(foreign), "workspace": {}})
        with pytest.raises(RequestRefused):
            await h.methods.sync_in({**h.with_lease(foreign), "operations": []})
    assert await h.request_count() == before
    await h.methods.destroy(h.lease_ref(lease))


async def test_resume_expires_without_http_when_placement_changed_or_marker_bad(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    before = await h.request_count()
    gone = {"providerLeaseId": None, "metadata": {"expired": True}}
    assert await h.methods.resume(h.lease_ref(lease, reuseLease=True, shape="s-2vcpu-4gb")) == gone
    assert await h.methods.resume(h.lease_ref(lease, reuseLease=True, rootfs="debian:13")) == gone
    assert await h.methods.resume(h.lease_ref(lease, reuseLease=True, region="eu")) == gone
    bad = {**lease, "metadata": {**lease["metadata"], "marker": "NOT-A-MARKER"}}
    assert await h.methods.resume(h.lease_ref(bad, reuseLease=True)) == gone
    assert await h.request_count() == before
    await h.methods.destroy(h.lease_ref(lease))


async def test_resume_expires_on_marker_mismatch_and_never_deletes(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    other_marker = "00000000-0000-4000-8000-000000000000"
    bad = {**lease, "metadata": {**lease["metadata"], "marker": other_marker}}
    result = await h.methods.resume(h.lease_ref(bad, reuseLease=True))
    assert result == {"providerLeaseId": None, "metadata": {"expired": True}}
    assert await status_of(h, lease["providerLeaseId"]) == "running"  # never deleted
    await h.methods.destroy(h.lease_ref(lease))


async def test_resume_expires_for_missing_or_terminal_sandbox(harness: Harness) -> None:
    h = harness
    gone = {"providerLeaseId": None, "metadata": {"expired": True}}
    lease = await h.acquire(reuseLease=True)
    await h.emulator.admin.add_fault("GET", r"^/v1/sandboxes/[^/]+$", status=404)
    assert await h.methods.resume(h.lease_ref(lease, reuseLease=True)) == gone
    for terminal in ("failed", "destroyed"):
        await h.emulator.admin.force_state(lease["providerLeaseId"], terminal)
        assert await h.methods.resume(h.lease_ref(lease, reuseLease=True)) == gone


async def test_resume_surfaces_transient_failures(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    await h.emulator.admin.add_fault("GET", r"^/v1/sandboxes/[^/]+$", times=3, status=503)
    with pytest.raises(ProviderError, match="503"):
        await h.methods.resume(h.lease_ref(lease, reuseLease=True))
    await h.emulator.admin.settings(delete_delay_ms=5000)  # destroying lasts 5 s
    await h.emulator.admin.force_state(lease["providerLeaseId"], "destroying")
    with pytest.raises(ProviderError, match="destroying"):
        await h.methods.resume(h.lease_ref(lease, reuseLease=True))


async def test_resume_of_paused_sandbox_submits_exactly_one_resume(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    await h.methods.release(h.lease_ref(lease, reuseLease=True))
    await h.emulator.admin.settings(stale_reads=2, resume_delay_ms=300)
    since = await h.request_count()
    resumed = await h.methods.resume(h.lease_ref(lease, reuseLease=True))
    assert resumed["providerLeaseId"] == lease["providerLeaseId"]
    requests = (await h.emulator.admin.requests())[since:]
    assert [r["path"].endswith("/resume") for r in requests].count(True) == 1
    assert requests[-1]["path"].endswith("/exec")


async def test_waiting_for_a_state_already_reached_only_reads(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    since = await h.request_count()
    await h.methods.resume(h.lease_ref(lease, reuseLease=True))
    methods = [r["method"] for r in (await h.emulator.admin.requests())[since:]]
    # the pre-check read, then the marker exec: it already reads running with its egress
    assert methods == ["GET", "POST"]
    await h.methods.destroy(h.lease_ref(lease))


async def test_acquire_workspace_failure_deletes_the_sandbox(harness: Harness) -> None:
    h = harness
    await h.emulator.admin.add_fault("POST", r"/exec$", status=503, times=3)  # retries spent
    with pytest.raises(ProviderError, match="503"):
        await h.acquire()
    assert await live_sandboxes(h) == []


async def test_acquire_warns_when_cleanup_also_fails(harness: Harness) -> None:
    h = harness
    await h.emulator.admin.add_fault("POST", r"/exec$", status=503, times=3)  # retries spent
    await h.emulator.admin.add_fault("DELETE", r"^/v1/sandboxes/[^/]+$", times=10, status=500)
    with pytest.raises(CleanupUnconfirmed, match=r"left behind") as caught:
        await h.acquire()
    (sandbox,) = await live_sandboxes(h)
    assert sandbox["id"] in str(caught.value)
    await h.emulator.admin.clear_faults()


async def test_ambiguous_create_finds_and_deletes_the_sandbox(harness: Harness) -> None:
    h = harness
    await h.emulator.admin.add_fault("POST", r"^/v1/sandboxes$", lose_response=True)
    with pytest.raises(ProviderError):
        await h.acquire()
    assert await live_sandboxes(h) == []
    requests = await h.emulator.admin.requests()
    assert [r["method"] for r in requests if r["path"] == "/v1/sandboxes"] == ["POST", "GET"]
    assert any(r["method"] == "DELETE" for r in requests)  # the created sandbox was found


async def test_create_rejected_by_server_error_leaves_nothing(harness: Harness) -> None:
    h = harness
    await h.emulator.admin.add_fault("POST", r"^/v1/sandboxes$", status=502)
    with pytest.raises(ProviderError, match="502"):
        await h.acquire()
    assert await live_sandboxes(h) == []
    creates = [r for r in await h.emulator.admin.requests() if r["method"] == "POST"]
    assert len(creates) == 1  # never retried


async def test_second_concurrent_release_is_refused(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    await h.emulator.admin.settings(pause_delay_ms=1500)
    outcomes: list[object] = []

    async def release() -> None:
        try:
            outcomes.append(await h.methods.release(h.lease_ref(lease, reuseLease=True)))
        except RequestRefused as exc:
            outcomes.append(exc)

    async def first_is_pausing() -> bool:
        return await status_of(h, lease["providerLeaseId"]) == "pausing"

    async with anyio.create_task_group() as tg:
        tg.start_soon(release)
        await wait_until(first_is_pausing)
        tg.start_soon(release)
    refused = [o for o in outcomes if isinstance(o, RequestRefused)]
    assert len(refused) == 1 and "in progress" in str(refused[0])
    assert {"providerLeaseId": lease["providerLeaseId"], "state": "stopped"} in outcomes


async def test_release_cancels_running_command_and_kills_tree_first(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    outcome: list[BaseException] = []

    async def long_command() -> None:
        try:
            await h.methods.execute(
                {
                    **h.with_lease(lease, reuseLease=True),
                    "command": "bash",
                    "args": ["-c", "(sleep 300 &) ; echo started; sleep 300"],
                }
            )
        except ProviderError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(long_command)
        with anyio.fail_after(20):
            while ("stdout", "started\n") not in h.live_chunks():
                await anyio.sleep(0.05)
        receipt = await h.methods.release(h.lease_ref(lease, reuseLease=True))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "stopped"}
    assert len(outcome) == 1 and "cancelled" in str(outcome[0])
    assert await h.emulator.admin.live_process_count() == 0
    await h.methods.destroy(h.lease_ref(lease))


async def test_probe_creates_runs_and_deletes(harness: Harness) -> None:
    result = await harness.methods.probe({**harness.call(), "environmentId": "unsaved"})
    assert result["ok"] is True, result
    assert "ran a command" in result["summary"]
    assert await live_sandboxes(harness) == []


async def test_probe_reports_failure_and_still_deletes(harness: Harness) -> None:
    await harness.emulator.admin.add_fault("POST", r"/exec$", status=400)
    result = await harness.methods.probe(harness.call())
    assert result["ok"] is False and "400" in result["summary"]
    assert await live_sandboxes(harness) == []
    assert harness.logs == [("warn", f"environmentProbe: {result['summary']}")]


async def test_probe_with_bad_config_answers_not_ok(harness: Harness) -> None:
    result = await harness.methods.probe(harness.call(shape=""))
    assert result["ok"] is False and "shape" in result["summary"]
    assert harness.logs == [("warn", f"environmentProbe: {result['summary']}")]


async def test_probe_fails_loudly_when_its_sandbox_cannot_be_deleted(harness: Harness) -> None:
    await harness.emulator.admin.add_fault("DELETE", r"^/v1/sandboxes/[^/]+$", times=10, status=500)
    with pytest.raises(ProviderError, match="left behind"):
        await harness.methods.probe(harness.call())
    await harness.emulator.admin.clear_faults()
