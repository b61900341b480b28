"""What each lease step costs on the wire, counted at the emulator (issue 22, item 3).

CreateOS allows 300 requests a minute per IP for every agent of a host together, so each lease
step is pinned to its exact request sequence: acquire (a workspace lease and a disposable one),
realize, release (delete, pause, warm), resume (paused and running) and destroy. The reaper's
listing after a reusable acquire runs in the background and is counted too. How many reads a
wait for a state takes (a delete until destroyed, a pause until paused) depends on how fast the
emulator gets there, so such a run of reads counts as one entry (:func:`polled`); the emulator's
pause and resume take no time here.
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


READS = "GET /v1/sandboxes/{id} ..."


def polled(seen: list[str]) -> list[str]:
    """``seen`` with its reads of the sandbox (a wait for a state) as one entry per run."""
    out: list[str] = []
    for entry in seen:
        entry = READS if entry == "GET /v1/sandboxes/{id}" else entry
        if not (entry == READS and out and out[-1] == READS):
            out.append(entry)
    return out


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
    # The delete answers destroying; the read that shows destroyed is what lets the receipt
    # say so (2.5: receipts require confirmed termination).
    lease, _ = await acquired(h)
    since = await h.request_count()
    receipt = await h.methods.release(h.lease_ref(lease))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}
    seen = await requests_since(h, since, lease["providerLeaseId"])
    assert polled(seen) == ["DELETE /v1/sandboxes/{id}", READS]


async def test_a_warm_release_is_one_sweep_and_one_list(h: Harness) -> None:
    lease, _ = await acquired(h, **WARM)
    since = await h.request_count()
    receipt = await h.methods.release(h.lease_ref(lease, **WARM))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "stopped"}
    seen = await requests_since(h, since, lease["providerLeaseId"])
    # One kill of every streamed command's tree (daemons they left are not managed processes),
    # then the managed processes: nothing alive, nothing to kill.
    assert seen == ["POST /v1/sandboxes/{id}/exec", "GET /v1/sandboxes/{id}/processes"]


async def test_a_pausing_release_submits_then_reads(h: Harness) -> None:
    lease, _ = await acquired(h, **KEEP_PAUSED)
    h.clock.advance(120)  # the reaper's next sweep is due: it lists once after the keep
    since = await h.request_count()
    receipt = await h.methods.release(h.lease_ref(lease, **KEEP_PAUSED))
    await h.settle()
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "stopped"}
    seen = await requests_since(h, since, lease["providerLeaseId"])
    # no read before the pause: its own answer says whether it may be submitted
    assert polled(seen) == ["POST /v1/sandboxes/{id}/pause", READS, "GET /v1/sandboxes"]


async def test_a_pause_refused_with_409_falls_back_to_reading_first(h: Harness) -> None:
    # A 409 says the sandbox was not running when the pause came; the reads then decide, and
    # submit the one pause the sandbox can take once it reads running.
    lease, _ = await acquired(h, **KEEP_PAUSED)
    await h.emulator.admin.add_fault("POST", r"/pause$", status=409)
    since = await h.request_count()
    receipt = await h.methods.release(h.lease_ref(lease, **KEEP_PAUSED))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "stopped"}
    rows = (await h.emulator.admin.requests())[since:]
    pauses = [row["status"] for row in rows if row["path"].endswith("/pause")]
    assert pauses == [409, 202]
    seen = await requests_since(h, since, lease["providerLeaseId"])
    assert polled(seen) == [
        "POST /v1/sandboxes/{id}/pause",
        READS,  # running
        "POST /v1/sandboxes/{id}/pause",
        READS,  # until paused
    ]


async def test_resume_of_a_paused_lease_is_read_resume_exec(h: Harness) -> None:
    lease, _ = await acquired(h, **KEEP_PAUSED)
    await h.methods.release(h.lease_ref(lease, **KEEP_PAUSED))
    since = await h.request_count()
    resumed = await h.methods.resume(h.lease_ref(lease, **KEEP_PAUSED))
    assert resumed["providerLeaseId"] == lease["providerLeaseId"]
    seen = await requests_since(h, since, lease["providerLeaseId"])
    # the read shows the stored egress in place (no PUT) and the state (no second read); the
    # marker exec is the read that shows running (reads follow only if it was refused: a
    # resume slower than the poll interval)
    assert seen[:3] == [
        "GET /v1/sandboxes/{id}",
        "POST /v1/sandboxes/{id}/resume",
        "POST /v1/sandboxes/{id}/exec",
    ]
    assert seen[-1] == "POST /v1/sandboxes/{id}/exec" and seen.count(seen[1]) == 1


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
    await h.emulator.admin.settings(resume_delay_ms=3000)  # far longer than the poll interval
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
        ({}, ["DELETE /v1/sandboxes/{id}", READS]),  # running: read until destroyed
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
    assert polled(await requests_since(h, since, lease["providerLeaseId"])) == expected


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
