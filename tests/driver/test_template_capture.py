"""Template capture, leases forked from a template and template delete through the real driver on
the emulator (docs/protocol.md 8.3-8.4, checklist 82 without the attach helper, 83 and 85)."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import pytest

from provider.driver.leases import forks
from provider.driver.setup.templates import endpoint_digest
from provider.errors import CleanupUnconfirmed, InvalidParams, ProviderError, RequestRefused
from tests.driver.conftest import Harness
from tests.driver.templates_support import (
    SETUP_FILE,
    alive_processes,
    api,
    capture,
    fork_bodies,
    fork_tokens,
    gone,
    host_redact,
    record_bodies,
    session_params,
    sh,
    start,
    start_shell,
    template,
    template_config,
    view,
)

pytestmark = pytest.mark.anyio


# -- capture, cancel promoted, acquire from the template (checklists 82 and 83) ---------------


async def test_capture_pauses_the_sandbox_without_processes_and_acquire_forks_it(
    harness: Harness,
) -> None:
    h = harness
    session = await start(h)
    sandbox_id = session["providerLeaseId"]
    assert (await sh(h, sandbox_id, f"echo prepared > {SETUP_FILE}"))["exit_code"] == 0
    await start_shell(h, sandbox_id)
    assert await alive_processes(h, sandbox_id)

    captured = await capture(h, session)
    assert captured["templateRef"] == sandbox_id
    assert captured["templateKind"] == "snapshot"
    metadata = captured["metadata"]
    assert set(metadata) == {"provider", "environmentId", "endpointDigest", "capturedAt"}
    assert metadata["provider"] == "createos"
    assert metadata["environmentId"] == h.environment_id
    assert metadata["endpointDigest"] == endpoint_digest(h.emulator.base_url)
    assert host_redact(metadata) == metadata
    sandbox = await view(h, sandbox_id)
    assert sandbox is not None and sandbox["status"] == "paused"
    assert await alive_processes(h, sandbox_id) == []

    before = await h.request_count()
    kept = await h.methods.cancel_setup(session_params(h, session, reason="promoted"))
    assert kept == {
        "status": "cancelled",
        "metadata": {"provider": "createos", "templateKept": True},
    }
    assert await h.request_count() == before

    # Checklist 83: a lease of the bound environment forks the template.
    await h.emulator.admin.add_fault(
        "POST", rf"^/v1/sandboxes/{sandbox_id}/fork$", times=2, status=409
    )
    sent = record_bodies(h)
    since = await h.request_count()
    config = template_config(sandbox_id, reuseLease=True, autoPauseAfterSeconds=600)
    lease = await h.acquire(**config)
    lease_id = lease["providerLeaseId"]
    assert lease_id != sandbox_id
    body = {"start_paused": False, "egress": ["*"], "ingress_enabled": False}
    assert fork_bodies(sent, sandbox_id) == [body, body, body]  # two scripted 409s, the fork
    assert len(set(fork_tokens(sent))) == 1  # the retries are the same fork: one token
    log = (await h.emulator.admin.requests())[since:]
    fork_statuses = [r["status"] for r in log if r["path"].endswith("/fork")]
    assert fork_statuses == [409, 409, 200]
    calls = [(m, p) for m, p, _ in sent]
    patch_at = calls.index(("PATCH", f"/v1/sandboxes/{lease_id}"))
    assert [b for m, _, b in sent if m == "PATCH"] == [{"auto_pause_after_seconds": 600}]
    assert ("GET", f"/v1/sandboxes/{lease_id}") in calls[:patch_at]  # waited for running
    assert calls[patch_at + 1] == ("POST", f"/v1/sandboxes/{lease_id}/exec")  # the marker
    assert not [p for m, p in calls if (m, p) == ("POST", "/v1/sandboxes")]  # nothing created
    leased = await view(h, lease_id)
    assert leased is not None and leased["auto_pause_after_seconds"] == 600

    meta = lease["metadata"]
    assert meta["snapshot"] == sandbox_id and meta["rootfs"] is None
    assert meta["marker"] != session["metadata"]["setupMarker"]  # a new marker replaced it
    result = await h.methods.execute(
        {**h.with_lease(lease, **config), "command": "cat", "args": [SETUP_FILE]}
    )
    assert result["exitCode"] == 0 and result["stdout"] == "prepared\n"

    # Resume: a changed snapshot is gone without a request; the same one resumes.
    receipt = await h.methods.release(h.lease_ref(lease, **config))
    assert receipt == {"providerLeaseId": lease_id, "state": "stopped"}
    before = await h.request_count()
    changed = await h.methods.resume(
        h.lease_ref(lease, **template_config("sb_other", reuseLease=True))
    )
    assert changed == {"providerLeaseId": None, "metadata": {"expired": True}}
    assert await h.request_count() == before
    resumed = await h.methods.resume(h.lease_ref(lease, **config))
    assert resumed["providerLeaseId"] == lease_id
    template_view = await view(h, sandbox_id)
    assert template_view is not None and template_view["status"] == "paused"


async def test_a_disposable_lease_of_a_template_disarms_the_inherited_idle_pause(
    harness: Harness,
) -> None:
    h = harness
    ref, _ = await template(h)
    sent = record_bodies(h)
    lease = await h.acquire(workspace=False, **template_config(ref, egressAllowlist=["github.com"]))
    assert fork_bodies(sent, ref) == [
        {"start_paused": False, "egress": ["github.com"], "ingress_enabled": False}
    ]
    assert [b for m, _, b in sent if m == "PATCH"] == [{"disable_auto_pause": True}]
    assert lease["metadata"]["reuseLease"] is False
    receipt = await h.methods.release(h.lease_ref(lease, **template_config(ref)))
    assert receipt is not None and receipt["state"] == "destroyed"


async def test_a_gone_template_refuses_acquire_and_a_failed_setup_deletes_the_fork(
    harness: Harness,
) -> None:
    h = harness
    with pytest.raises(ProviderError, match="no longer exists"):
        await h.acquire(**template_config("sb_00000000000000000000000000"))
    ref, _ = await template(h)
    await h.emulator.admin.add_fault(
        "POST", r"^/v1/sandboxes/[^/]+/exec$", status=503, times=3
    )  # retries spent
    since = await h.request_count()
    with pytest.raises(ProviderError, match="503"):
        await h.acquire(**template_config(ref))
    log = (await h.emulator.admin.requests())[since:]
    (failed,) = {r["path"] for r in log if r["path"].endswith("/exec")}
    fork_id = failed.split("/")[3]
    assert fork_id != ref
    assert ("DELETE", f"/v1/sandboxes/{fork_id}") in [(r["method"], r["path"]) for r in log]
    assert await gone(h, fork_id)
    template_view = await view(h, ref)
    assert template_view is not None and template_view["status"] == "paused"


async def forks_of(h: Harness, ref: str) -> list[dict[str, Any]]:
    """The API's views of every sandbox forked from ``ref`` (deleted ones included)."""
    async with api(h) as client:
        listed = (await client.get("/v1/sandboxes", params={"limit": 100})).json()["data"]["data"]
    return [s for s in listed if s.get("forked_from") == ref]


def watched_tokens(h: Harness) -> list[str]:
    journal = h.methods.runtime.journal
    return journal.orphan_creates(h.emulator.base_url, hashlib.sha256(b"test-key").hexdigest())


async def test_a_fork_whose_answer_was_lost_is_found_by_its_token_and_deleted(
    harness: Harness,
) -> None:
    h = harness
    ref, _ = await template(h)
    sent = record_bodies(h)
    await h.emulator.admin.add_fault("POST", r"/fork$", lose_response=True)
    with pytest.raises(ProviderError) as caught:
        await h.acquire(**template_config(ref))
    assert not isinstance(caught.value, CleanupUnconfirmed)  # found, so nothing is left
    (token,) = fork_tokens(sent)
    (forked,) = await forks_of(h, ref)  # the fork did happen
    assert token in forked["envs"]
    assert await gone(h, forked["id"])
    calls = [(m, p) for m, p, _ in sent]
    listed = calls.index(("GET", "/v1/sandboxes"))
    assert ("DELETE", f"/v1/sandboxes/{forked['id']}") in calls[listed:]
    assert watched_tokens(h) == []  # settled: recovery has nothing to look for
    template_view = await view(h, ref)
    assert template_view is not None and template_view["status"] == "paused"


async def test_a_fork_that_lands_after_its_lookup_is_deleted_by_a_later_call(
    harness: Harness,
) -> None:
    """A 502 fork (outcome unknown; a 503 is a definite refusal): the lookup finds nothing,
    but a fork that timed out on our side may still be
    served late, so the journal keeps watching its token; the next call deletes it."""
    h = harness
    ref, _ = await template(h)
    sent = record_bodies(h)
    await h.emulator.admin.add_fault("POST", r"/fork$", status=502)
    with pytest.raises(ProviderError, match="502") as caught:
        await h.acquire(**template_config(ref))
    assert not isinstance(caught.value, CleanupUnconfirmed)
    (token,) = fork_tokens(sent)
    assert await forks_of(h, ref) == []
    assert watched_tokens(h) == [token]
    async with api(h) as client:  # the late fork lands, carrying the token
        late = await client.post(
            f"/v1/sandboxes/{ref}/fork", json={"envs": {token: "1"}, "egress": ["*"]}
        )
        late_id = late.json()["data"]["id"]
        # A fork of the same template without the token is someone else's: left alone.
        other = await client.post(f"/v1/sandboxes/{ref}/fork", json={"egress": ["*"]})
        other_id = other.json()["data"]["id"]
    lease = await h.acquire()  # any later call of this origin and key
    assert await gone(h, late_id)
    other_view = await view(h, other_id)
    assert other_view is not None and other_view["status"] == "running"
    assert watched_tokens(h) == []
    await h.methods.destroy(h.lease_ref(lease))


async def test_a_fork_of_unknown_outcome_whose_lookup_fails_names_what_to_look_for(
    harness: Harness,
) -> None:
    h = harness
    ref, _ = await template(h)
    sent = record_bodies(h)
    await h.emulator.admin.add_fault("POST", r"/fork$", status=502)
    await h.emulator.admin.add_fault("GET", r"^/v1/sandboxes$", times=50, status=500)
    with pytest.raises(CleanupUnconfirmed) as caught:
        await h.acquire(**template_config(ref))
    (token,) = fork_tokens(sent)
    assert f"a sandbox forked from {ref} with the env key {token}" in str(caught.value)
    assert watched_tokens(h) == [token]  # later calls keep looking
    await h.emulator.admin.clear_faults()


async def test_a_fork_that_keeps_answering_409_gives_up_after_its_retries(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    ref, _ = await template(h)
    monkeypatch.setattr(forks, "FORK_CONFLICT_RETRIES", 2)
    await h.emulator.admin.add_fault("POST", r"/fork$", times=5, status=409)
    since = await h.request_count()
    with pytest.raises(ProviderError, match="409 after 2 retries"):
        await h.acquire(**template_config(ref))
    log = (await h.emulator.admin.requests())[since:]
    assert [r["status"] for r in log if r["path"].endswith("/fork")] == [409, 409, 409]


async def test_capture_refuses_a_sandbox_whose_marker_is_not_the_sessions(
    harness: Harness,
) -> None:
    h = harness
    session = await start(h)
    other = {**session, "metadata": {**session["metadata"], "setupMarker": str(uuid.uuid4())}}
    with pytest.raises(ProviderError, match="marker"):
        await capture(h, other)
    sandbox = await view(h, session["providerLeaseId"])
    assert sandbox is not None and sandbox["status"] == "running"
    with pytest.raises(InvalidParams):
        await h.methods.capture_template(session_params(h, session, timeoutMs=0))


# -- delete template (checklist 85) -----------------------------------------------------------


def delete_params(h: Harness, ref: str, metadata: dict[str, Any], **extra: Any) -> dict[str, Any]:
    # The host stores our capture metadata with its own keys beside it.
    stored = {**metadata, "setupRpcCompanyId": h.company_id, "runtimeConfigBinding": {}}
    return {
        **h.call(),
        "templateRef": ref,
        "templateKind": "snapshot",
        "metadata": stored,
        "reason": "disabled",
        **extra,
    }


async def test_delete_template_deletes_a_paused_template_and_accepts_a_gone_one(
    harness: Harness,
) -> None:
    h = harness
    ref, metadata = await template(h)
    assert await h.methods.delete_template(delete_params(h, ref, metadata)) == {"deleted": True}
    assert await gone(h, ref)
    assert await h.methods.delete_template(delete_params(h, ref, metadata)) == {"deleted": True}
    unknown = "sb_0000000000000000000000NONE"
    since = await h.request_count()
    assert await h.methods.delete_template(delete_params(h, unknown, metadata)) == {"deleted": True}
    log = (await h.emulator.admin.requests())[since:]
    assert [(r["method"], r["status"]) for r in log] == [("GET", 404)]


async def test_delete_template_refuses_a_running_sandbox_and_foreign_metadata(
    harness: Harness,
) -> None:
    h = harness
    ref, metadata = await template(h)
    session = await start(h)
    running = session["providerLeaseId"]
    since = await h.request_count()
    with pytest.raises(ProviderError, match="running"):
        await h.methods.delete_template(delete_params(h, running, metadata))
    log = (await h.emulator.admin.requests())[since:]
    assert not [r for r in log if r["method"] == "DELETE"]
    sandbox = await view(h, running)
    assert sandbox is not None and sandbox["status"] == "running"

    before = await h.request_count()
    refusals: list[tuple[str, dict[str, Any]]] = [
        ("another environment", delete_params(h, ref, {**metadata, "environmentId": "env-2"})),
        (
            "another API endpoint",
            delete_params(h, ref, {**metadata, "endpointDigest": endpoint_digest("https://x.y")}),
        ),
        ("not captured by the CreateOS", delete_params(h, ref, {})),
        ("another kind", delete_params(h, ref, metadata, templateKind="image")),
        ("not a valid CreateOS sandbox id", delete_params(h, "sb/../1", metadata)),
    ]
    for message, params in refusals:
        with pytest.raises(RequestRefused, match=message):
            await h.methods.delete_template(params)
    assert await h.request_count() == before
    template_view = await view(h, ref)
    assert template_view is not None and template_view["status"] == "paused"
