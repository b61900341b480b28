"""What each lease step costs on the wire, counted at the emulator (issue 22, item 3).

CreateOS allows 300 requests a minute per IP for every agent of a host together, so each lease
step is pinned to its exact request sequence: acquire (a workspace lease and a disposable one),
realize, release (delete, pause, warm), resume (paused and running) and destroy. The reaper's
listing after a reusable acquire runs in the background and is counted too. The emulator's
pause and resume take no time here, so the one read after a pause (and the exec after a resume)
finds the state reached whatever the machine's load.
"""

from __future__ import annotations

from typing import Any

import pytest

from provider.errors import ProviderError
from tests.driver.conftest import Harness
from tests.driver.templates_support import template, template_config

pytestmark = pytest.mark.anyio

WARM = {"reuseLease": True, "autoPauseAfterSeconds": 600}
KEEP_PAUSED = {"reuseLease": True}  # the harness's window is 0: pause at release


async def requests_since(h: Harness, since: int, sandbox_id: str) -> list[str]:
    """The requests after ``since`` as ``METHOD path``, the sandbox id shown as ``{id}``."""
    rows: list[dict[str, Any]] = (await h.emulator.admin.requests())[since:]
    return [f"{row['method']} {row['path'].replace(sandbox_id, '{id}')}" for row in rows]


async def acquired(h: Harness, **options: Any) -> tuple[dict[str, Any], list[str]]:
    since = await h.request_count()
    lease = await h.acquire(**options)
    return lease, await requests_since(h, since, lease["providerLeaseId"])


@pytest.fixture
async def h(harness: Harness) -> Harness:
    await harness.emulator.admin.settings(pause_delay_ms=0, resume_delay_ms=0)
    return harness


CREATE_AND_PREPARE = ["POST /v1/sandboxes", "POST /v1/sandboxes/{id}/exec"]


@pytest.mark.parametrize("workspace", [True, False], ids=["workspace", "disposable"])
async def test_a_fresh_acquire_with_the_default_config_is_two_requests(
    h: Harness, workspace: bool
) -> None:
    # The create answers running, so no read; the workspace and the marker are one exec.
    lease, seen = await acquired(h, workspace=workspace)
    assert seen == CREATE_AND_PREPARE
    since = await h.request_count()
    realized = await h.methods.realize({**h.with_lease(lease), "workspace": {"localPath": "/x"}})
    assert realized["cwd"] == "/paperclip-workspace"
    assert await h.request_count() == since  # realize makes none


async def test_a_reusable_acquire_adds_only_the_reapers_listing(h: Harness) -> None:
    _, seen = await acquired(h, **WARM)
    assert seen == [*CREATE_AND_PREPARE, "GET /v1/sandboxes"]  # the sweep, off the call's path


async def test_release_with_the_default_config_deletes_and_confirms(h: Harness) -> None:
    # The delete answers destroying; the one read that shows destroyed is what lets the
    # receipt say so (2.5: receipts require confirmed termination).
    lease, _ = await acquired(h)
    since = await h.request_count()
    receipt = await h.methods.release(h.lease_ref(lease))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}
    seen = await requests_since(h, since, lease["providerLeaseId"])
    assert seen == ["DELETE /v1/sandboxes/{id}", "GET /v1/sandboxes/{id}"]


async def test_a_warm_release_is_one_request(h: Harness) -> None:
    lease, _ = await acquired(h, **WARM)
    since = await h.request_count()
    receipt = await h.methods.release(h.lease_ref(lease, **WARM))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "stopped"}
    seen = await requests_since(h, since, lease["providerLeaseId"])
    assert seen == ["GET /v1/sandboxes/{id}/processes"]  # nothing alive: nothing to kill


async def test_a_pausing_release_submits_then_reads_once(h: Harness) -> None:
    lease, _ = await acquired(h, **KEEP_PAUSED)
    h.clock.advance(120)  # the reaper's next sweep is due: it lists once after the keep
    since = await h.request_count()
    receipt = await h.methods.release(h.lease_ref(lease, **KEEP_PAUSED))
    await h.settle()
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "stopped"}
    seen = await requests_since(h, since, lease["providerLeaseId"])
    assert seen == ["POST /v1/sandboxes/{id}/pause", "GET /v1/sandboxes/{id}", "GET /v1/sandboxes"]


async def test_resume_of_a_paused_lease_is_read_resume_exec(h: Harness) -> None:
    lease, _ = await acquired(h, **KEEP_PAUSED)
    await h.methods.release(h.lease_ref(lease, **KEEP_PAUSED))
    since = await h.request_count()
    resumed = await h.methods.resume(h.lease_ref(lease, **KEEP_PAUSED))
    assert resumed["providerLeaseId"] == lease["providerLeaseId"]
    seen = await requests_since(h, since, lease["providerLeaseId"])
    # the read shows the stored egress in place (no PUT); the marker exec shows running
    assert seen == [
        "GET /v1/sandboxes/{id}",
        "POST /v1/sandboxes/{id}/resume",
        "POST /v1/sandboxes/{id}/exec",
    ]


async def test_resume_of_a_warm_lease_is_read_and_exec(h: Harness) -> None:
    lease, _ = await acquired(h, **WARM)
    await h.methods.release(h.lease_ref(lease, **WARM))
    since = await h.request_count()
    resumed = await h.methods.resume(h.lease_ref(lease, **WARM))
    assert resumed["metadata"]["resumedLease"] is True
    seen = await requests_since(h, since, lease["providerLeaseId"])
    assert seen == ["GET /v1/sandboxes/{id}", "POST /v1/sandboxes/{id}/exec"]


async def test_resume_reads_until_running_when_the_exec_finds_it_resuming(h: Harness) -> None:
    # The resume takes longer than the poll interval: the exec is refused with 409 (nothing
    # ran), the reads follow until running, then the exec runs; still one resume.
    lease, _ = await acquired(h, **KEEP_PAUSED)
    await h.methods.release(h.lease_ref(lease, **KEEP_PAUSED))
    await h.emulator.admin.settings(resume_delay_ms=700)
    since = await h.request_count()
    resumed = await h.methods.resume(h.lease_ref(lease, **KEEP_PAUSED))
    assert resumed["providerLeaseId"] == lease["providerLeaseId"]
    rows = (await h.emulator.admin.requests())[since:]
    calls = [(row["method"], row["path"].rsplit("/", 1)[-1], row["status"]) for row in rows]
    assert calls[:3] == [
        ("GET", lease["providerLeaseId"], 200),
        ("POST", "resume", 202),
        ("POST", "exec", 409),
    ]
    assert calls[-1] == ("POST", "exec", 200)
    assert {call[0] for call in calls[3:-1]} == {"GET"}


async def test_an_exec_refused_while_the_sandbox_reads_running_fails_the_resume(
    h: Harness,
) -> None:
    # A 409 right after a read that said running is not a state to wait out: the resume
    # fails (transient) instead of reading and retrying until its deadline.
    lease, _ = await acquired(h, **WARM)
    await h.emulator.admin.add_fault("POST", r"/exec$", status=409, times=5)
    since = await h.request_count()
    with pytest.raises(ProviderError, match="409"):
        await h.methods.resume(h.lease_ref(lease, **WARM))
    seen = await requests_since(h, since, lease["providerLeaseId"])
    assert seen == [
        "GET /v1/sandboxes/{id}",
        "POST /v1/sandboxes/{id}/exec",  # refused: maybe paused since the read
        "GET /v1/sandboxes/{id}",  # running
        "POST /v1/sandboxes/{id}/exec",  # refused again: the failure is the exec's
    ]
    await h.emulator.admin.clear_faults()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, ["DELETE /v1/sandboxes/{id}", "GET /v1/sandboxes/{id}"]),  # running: confirmed
        (KEEP_PAUSED, ["DELETE /v1/sandboxes/{id}"]),  # paused: answered destroyed at once
    ],
    ids=["running", "paused"],
)
async def test_destroy(h: Harness, options: dict[str, Any], expected: list[str]) -> None:
    lease, _ = await acquired(h, **options)
    if options:
        await h.methods.release(h.lease_ref(lease, **options))
    since = await h.request_count()
    receipt = await h.methods.destroy(h.lease_ref(lease, **options))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}
    assert await requests_since(h, since, lease["providerLeaseId"]) == expected


async def test_a_lease_forked_from_a_template_resumes_without_an_egress_put(h: Harness) -> None:
    # The fork holds ["*"] for allow-all (2.9.3), the lease stores []: the same policy, so
    # the read that shows it spares the PUT.
    ref, _ = await template(h)
    config = template_config(ref, **WARM)
    lease, seen = await acquired(h, **config)
    assert seen[0] == f"POST /v1/sandboxes/{ref}/fork" and seen[-1] == "GET /v1/sandboxes"
    await h.methods.release(h.lease_ref(lease, **config))
    since = await h.request_count()
    resumed = await h.methods.resume(h.lease_ref(lease, **config))
    assert resumed["providerLeaseId"] == lease["providerLeaseId"]
    seen = await requests_since(h, since, lease["providerLeaseId"])
    assert seen == ["GET /v1/sandboxes/{id}", "POST /v1/sandboxes/{id}/exec"]
