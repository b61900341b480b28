"""Interactive setup sessions and snapshot templates through the real driver on the emulator
(provider-behavior.md 8, checklist 81, 82 without the attach helper, 83-85), plus the host's
redaction rules applied to our setup and capture metadata (host-protocol.md 10.4)."""

from __future__ import annotations

import json
import re
import shlex
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

from provider.config import EnvironmentConfig
from provider.createos.client import CreateOSClient
from provider.createos.pacer import RequestPacer
from provider.driver import forks
from provider.driver.runtime import deadline, deadline_warning
from provider.driver.templates import SETUP_METADATA_KEYS, connection_payload, endpoint_digest
from provider.errors import CleanupUnconfirmed, InvalidParams, ProviderError, RequestRefused
from tests.driver.conftest import SHAPE, Harness

pytestmark = pytest.mark.anyio

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
EXPIRES_AT = "2030-01-01T00:00:00.000Z"
SETUP_FILE = "/paperclip-workspace/setup.txt"
MARKER_PATH = "/paperclip-workspace/.paperclip-runtime/.paperclip-createos-lease"


# -- the host's redaction of setup and template metadata (host-protocol.md 10.4) -------------

# A port of redactEnvironmentCustomImageValue (@paperclipai/shared, environment-custom-images.js).
_SENSITIVE_KEYS = [
    re.compile(pattern, re.IGNORECASE | re.ASCII)
    for pattern in (
        r"auth",
        r"credential",
        r"host",
        r"ip",
        r"^key$",
        r"lease",
        r"password",
        r"private.?key",
        r"sandbox.?id",
        r"secret",
        r"template.?ref",
        r"token",
        r"url",
    )
]
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b", re.ASCII)
_SSH_COMMAND = re.compile(r"\bssh\s+[-\w@.:/]+\b", re.IGNORECASE | re.ASCII)


def host_redact(value: Any) -> Any:
    if isinstance(value, list):
        return [host_redact(entry) for entry in value]
    if isinstance(value, dict):
        return {
            key: "[redacted]"
            if not key.endswith("Redacted") and any(p.search(key) for p in _SENSITIVE_KEYS)
            else host_redact(entry)
            for key, entry in value.items()
        }
    if isinstance(value, str) and (_IPV4.search(value) or _SSH_COMMAND.search(value)):
        return "[redacted]"
    return value


def test_the_redactor_port_redacts_what_the_host_redacts() -> None:
    redacted = host_redact(
        {
            "apiUrl": "https://x",
            "sandboxId": "sb_1",
            "sandbox_id": "sb_1",
            "providerLeaseId": "sb_1",
            "templateRef": "sb_1",
            "key": "k",
            "ip": "x",
            "description": "x",  # "ip" inside a word counts too
            "hostRedacted": True,
            "nested": [{"note": "ssh root@example.com"}, "10.0.0.2", "keep"],
            "monkey": "fine",  # only exactly "key"
        }
    )
    assert redacted == {
        "apiUrl": "[redacted]",
        "sandboxId": "[redacted]",
        "sandbox_id": "[redacted]",
        "providerLeaseId": "[redacted]",
        "templateRef": "[redacted]",
        "key": "[redacted]",
        "ip": "[redacted]",
        "description": "[redacted]",
        "hostRedacted": True,
        "nested": [{"note": "[redacted]"}, "[redacted]", "keep"],
        "monkey": "fine",
    }


@pytest.mark.parametrize("expires_at", [None, EXPIRES_AT, "2030-01-01T00:00:00Z"])
def test_setup_and_capture_metadata_survive_the_hosts_redaction(expires_at: str | None) -> None:
    for api_url in ("https://api.sb.createos.sh", "http://127.0.0.1:8790", "http://[::1]:1"):
        for _ in range(50):
            setup = {
                "provider": "createos",
                "companyId": str(uuid.uuid4()),
                "environmentId": str(uuid.uuid4()),
                "endpointDigest": endpoint_digest(api_url),
                "setupMarker": str(uuid.uuid4()),
                "expiresAt": expires_at,
            }
            assert tuple(setup) == SETUP_METADATA_KEYS
            assert host_redact(setup) == setup
    capture = {
        "provider": "createos",
        "environmentId": "instance",
        "endpointDigest": endpoint_digest("http://127.0.0.1:8790"),
        "capturedAt": "2030-01-01T00:00:00.123Z",
    }
    assert host_redact(capture) == capture
    kept = {"provider": "createos", "templateKept": True}
    assert host_redact(kept) == kept


def test_the_connection_payload_quotes_and_names_the_official_cli_for_the_official_endpoint() -> (
    None
):
    official = connection_payload("https://api.sb.createos.sh", "sb_01ABC", EXPIRES_AT)
    assert official == {
        "type": "createos_shell",
        "command": "python3 -m provider shell --api-url 'https://api.sb.createos.sh' 'sb_01ABC'",
        "expiresAt": EXPIRES_AT,
        "alternativeCommand": "createos sandbox shell sb_01ABC",
    }
    local = connection_payload("http://127.0.0.1:8790", "sb-x", None)
    assert "alternativeCommand" not in local
    assert shlex.split(local["command"]) == [
        "python3",
        "-m",
        "provider",
        "shell",
        "--api-url",
        "http://127.0.0.1:8790",
        "sb-x",
    ]
    odd = connection_payload("https://it's.example", "sb_1", None)  # never a real origin
    assert shlex.split(odd["command"])[-2:] == ["https://it's.example", "sb_1"]


# -- helpers ----------------------------------------------------------------------------------


class _Recorder(httpx.AsyncBaseTransport):
    """Passes requests on and records method, path and JSON body of each."""

    def __init__(self, sent: list[tuple[str, str, Any]]) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._sent = sent

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            body: Any = json.loads(request.content) if request.content else None
        except (httpx.RequestNotRead, ValueError):
            body = None
        self._sent.append((request.method, request.url.path, body))
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def record_bodies(h: Harness) -> list[tuple[str, str, Any]]:
    """From now on, every request the driver sends, with its JSON body."""
    sent: list[tuple[str, str, Any]] = []

    def factory(config: EnvironmentConfig, api_key: str) -> CreateOSClient:
        pacer = RequestPacer(config.api_url, interval=0.0, shared_dir=None)
        return CreateOSClient(
            config.api_url, api_key, pacer=pacer, backoff_base=0.01, transport=_Recorder(sent)
        )

    h.methods.runtime.client_factory = factory
    return sent


@asynccontextmanager
async def api(h: Harness) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=h.emulator.base_url, headers={"X-Api-Key": "test-key"}, timeout=30
    ) as client:
        yield client


async def view(h: Harness, sandbox_id: str) -> dict[str, Any] | None:
    async with api(h) as client:
        answer = await client.get(f"/v1/sandboxes/{sandbox_id}")
    if answer.status_code == 404:
        return None
    return dict(answer.json()["data"])


async def gone(h: Harness, sandbox_id: str) -> bool:
    found = await view(h, sandbox_id)
    return found is None or found["status"] == "destroyed"


async def sh(h: Harness, sandbox_id: str, script: str) -> dict[str, Any]:
    async with api(h) as client:
        answer = await client.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "/bin/bash", "args": ["-lc", script]}
        )
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["data"]["result"])


async def start_shell(h: Harness, sandbox_id: str) -> str:
    """What the attach helper leaves running: a login shell on a terminal, and a daemon."""
    async with api(h) as client:
        answer = await client.post(
            f"/v1/sandboxes/{sandbox_id}/processes",
            json={
                "cmd": "/bin/bash",
                "args": ["-lc", "setsid sleep 1000 >/dev/null 2>&1 < /dev/null & exec bash -l"],
                "cwd": "/paperclip-workspace",
                "pty": {"rows": 24, "cols": 80},
            },
        )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["data"]["process_id"])


async def alive_processes(h: Harness, sandbox_id: str) -> list[dict[str, Any]]:
    state = await h.emulator.admin.state()
    return [p for p in state["processes"] if p["sandbox_id"] == sandbox_id and p["tree_alive"]]


def start_params(h: Harness, *, source: str | None = None, **config: Any) -> dict[str, Any]:
    return {
        **h.call(**config),
        "sessionId": str(uuid.uuid4()),
        "sourceTemplateRef": source,
        "sourceTemplateKind": "snapshot" if source is not None else None,
        "connectionExpiresInMinutes": 15,
        "expiresAt": EXPIRES_AT,
    }


def session_params(h: Harness, session: dict[str, Any], **extra: Any) -> dict[str, Any]:
    # The host hands back its own keys beside ours (setupRpcCompanyId, a config fingerprint).
    metadata = {**session["metadata"], "setupRpcCompanyId": h.company_id, "x": "y"}
    return {
        **h.call(),
        "providerLeaseId": session["providerLeaseId"],
        "setupMetadata": metadata,
        **extra,
    }


async def start(h: Harness, **kwargs: Any) -> dict[str, Any]:
    return await h.methods.start_setup(start_params(h, **kwargs))


async def capture(h: Harness, session: dict[str, Any]) -> dict[str, Any]:
    return await h.methods.capture_template(
        session_params(h, session, templateLabel="paperclip-env-1-abcd", timeoutMs=60_000)
    )


async def template(h: Harness) -> tuple[str, dict[str, Any]]:
    """A captured template holding SETUP_FILE: its id and the capture metadata."""
    session = await start(h)
    assert (await sh(h, session["providerLeaseId"], f"echo prepared > {SETUP_FILE}"))[
        "exit_code"
    ] == 0
    captured = await capture(h, session)
    return captured["templateRef"], captured["metadata"]


def template_config(ref: str, **config: Any) -> dict[str, Any]:
    return {"snapshot": ref, **config}


# -- start and get (checklist 81) -------------------------------------------------------------


async def test_start_creates_a_named_setup_sandbox_and_answers_waiting_for_user(
    harness: Harness,
) -> None:
    h = harness
    sent = record_bodies(h)
    session = await start(h, egressAllowlist=["github.com"], reuseLease=True)
    sandbox_id = session["providerLeaseId"]

    creates = [body for method, path, body in sent if (method, path) == ("POST", "/v1/sandboxes")]
    (body,) = creates
    assert re.fullmatch(f"pc-setup-{UUID}", body.pop("name"))
    assert body == {"shape": SHAPE, "egress": ["github.com"], "ingress_enabled": False}
    sandbox = await view(h, sandbox_id)
    assert sandbox is not None and sandbox["status"] == "running"
    assert "auto_pause_after_seconds" not in sandbox  # no idle pause while the operator works

    metadata = session["metadata"]
    assert re.fullmatch(UUID, metadata["setupMarker"])
    assert session == {
        "providerLeaseId": sandbox_id,
        "status": "waiting_for_user",
        "expiresAt": EXPIRES_AT,
        "connectionSummary": {
            "type": "createos_shell",
            "hostRedacted": True,
            "portRedacted": True,
            "expiresAt": EXPIRES_AT,
        },
        "connectionPayload": {
            "type": "createos_shell",
            "command": (
                f"python3 -m provider shell --api-url '{h.emulator.base_url}' '{sandbox_id}'"
            ),
            "expiresAt": EXPIRES_AT,
        },
        "metadata": {
            "provider": "createos",
            "companyId": h.company_id,
            "environmentId": h.environment_id,
            "endpointDigest": endpoint_digest(h.emulator.base_url),
            "setupMarker": metadata["setupMarker"],
            "expiresAt": EXPIRES_AT,
        },
    }
    assert "test-key" not in json.dumps(session)
    assert host_redact(session["metadata"]) == session["metadata"]
    marker = await sh(h, sandbox_id, f"cat {MARKER_PATH}")
    assert marker["stdout"] == metadata["setupMarker"]


async def test_get_answers_the_session_resumes_a_paused_sandbox_and_reports_missing(
    harness: Harness,
) -> None:
    h = harness
    session = await start(h)
    sandbox_id = session["providerLeaseId"]
    plain = await h.methods.get_setup(session_params(h, session))
    assert plain["status"] == "waiting_for_user"
    assert "connectionPayload" not in plain
    assert plain["metadata"] == session["metadata"]  # the host replaces its copy with ours
    with_payload = await h.methods.get_setup(
        session_params(h, session, includeConnectionPayload=True)
    )
    assert with_payload["connectionPayload"] == session["connectionPayload"]

    async with api(h) as client:
        assert (await client.post(f"/v1/sandboxes/{sandbox_id}/pause")).status_code in (200, 202)
    again = await h.methods.get_setup(session_params(h, session))
    assert again["status"] == "waiting_for_user"
    sandbox = await view(h, sandbox_id)
    assert sandbox is not None and sandbox["status"] == "running"

    async with api(h) as client:
        await client.delete(f"/v1/sandboxes/{sandbox_id}")
    missing = await h.methods.get_setup(session_params(h, session))
    assert missing["status"] == "missing" and missing["connectionSummary"] is None
    before = await h.request_count()
    nothing = await h.methods.get_setup({**h.call(), "providerLeaseId": None})
    assert nothing == {"providerLeaseId": None, "status": "missing", "connectionSummary": None}
    assert await h.request_count() == before


async def test_start_from_a_template_forks_it_and_disarms_the_idle_pause(harness: Harness) -> None:
    h = harness
    ref, _ = await template(h)
    sent = record_bodies(h)
    session = await start(h, source=ref)
    sandbox_id = session["providerLeaseId"]
    assert sandbox_id != ref
    fork_body = {"start_paused": False, "egress": ["*"], "ingress_enabled": False}
    calls = [(method, path) for method, path, _ in sent]
    assert [b for _, p, b in sent if p.endswith("/fork")] == [fork_body]
    assert [b for m, _, b in sent if m == "PATCH"] == [{"disable_auto_pause": True}]
    fork_at = calls.index(("POST", f"/v1/sandboxes/{ref}/fork"))
    patch_at = calls.index(("PATCH", f"/v1/sandboxes/{sandbox_id}"))
    assert fork_at < patch_at < calls.index(("POST", f"/v1/sandboxes/{sandbox_id}/exec"))
    assert ("POST", "/v1/sandboxes") not in calls
    assert (await sh(h, sandbox_id, f"cat {SETUP_FILE}"))["stdout"] == "prepared\n"
    assert session["status"] == "waiting_for_user"
    source = await view(h, ref)
    assert source is not None and source["status"] == "paused"  # the template stays as it was


@pytest.mark.parametrize(
    ("kind", "ref"),
    [("image", "devbox:1"), ("provider_template", "sb_1"), ("snapshot", "../sb"), (None, "a b")],
)
async def test_start_refuses_another_source_kind_or_a_bad_ref_before_any_request(
    harness: Harness, kind: str | None, ref: str
) -> None:
    h = harness
    params = {**start_params(h), "sourceTemplateRef": ref, "sourceTemplateKind": kind}
    before = await h.request_count()
    with pytest.raises(RequestRefused):
        await h.methods.start_setup(params)
    assert await h.request_count() == before


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
    forks_sent = [b for m, p, b in sent if p == f"/v1/sandboxes/{sandbox_id}/fork"]
    body = {"start_paused": False, "egress": ["*"], "ingress_enabled": False}
    assert forks_sent == [body, body, body]  # two scripted 409s, then the fork
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
    forks_sent = [b for m, p, b in sent if p.endswith("/fork")]
    assert forks_sent == [
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
    await h.emulator.admin.add_fault("POST", r"^/v1/sandboxes/[^/]+/exec$", status=503)
    since = await h.request_count()
    with pytest.raises(ProviderError, match="503"):
        await h.acquire(**template_config(ref))
    log = (await h.emulator.admin.requests())[since:]
    (failed,) = [r["path"] for r in log if r["path"].endswith("/exec")]
    fork_id = failed.split("/")[3]
    assert fork_id != ref
    assert ("DELETE", f"/v1/sandboxes/{fork_id}") in [(r["method"], r["path"]) for r in log]
    assert await gone(h, fork_id)
    template_view = await view(h, ref)
    assert template_view is not None and template_view["status"] == "paused"


async def test_a_fork_of_unknown_outcome_warns_that_a_sandbox_may_be_left_behind(
    harness: Harness,
) -> None:
    h = harness
    ref, _ = await template(h)
    await h.emulator.admin.add_fault("POST", r"/fork$", status=503)
    with pytest.raises(CleanupUnconfirmed, match=f"forked from template {ref} may have been"):
        await h.acquire(**template_config(ref))


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


# -- cancel (checklist 84) --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "status"),
    [("timed_out", "timed_out"), ("Operator stopped the setup", "cancelled"), (None, "cancelled")],
)
async def test_cancel_deletes_the_setup_sandbox(
    harness: Harness, reason: str | None, status: str
) -> None:
    h = harness
    session = await start(h)
    answer = await h.methods.cancel_setup(session_params(h, session, reason=reason))
    assert answer == {"status": status}
    assert await gone(h, session["providerLeaseId"])
    again = await h.methods.cancel_setup(session_params(h, session, reason=reason))
    assert again == {"status": "missing"}
    before = await h.request_count()
    assert await h.methods.cancel_setup({**h.call(), "providerLeaseId": None}) == {
        "status": "missing"
    }
    assert await h.request_count() == before


async def test_foreign_setup_metadata_is_refused_with_zero_requests(harness: Harness) -> None:
    h = harness
    session = await start(h)
    meta = session["metadata"]
    foreign: list[tuple[str, dict[str, Any]]] = [
        ("another environment", {**meta, "environmentId": "env-2"}),
        ("another company", {**meta, "companyId": "company-2"}),
        ("another API endpoint", {**meta, "endpointDigest": endpoint_digest("https://x.example")}),
        ("not started by the CreateOS", {**meta, "provider": "other"}),
        ("setupMarker", {**meta, "setupMarker": "[redacted]"}),
        ("not started by the CreateOS", {}),
    ]
    before = await h.request_count()
    for message, metadata in foreign:
        params = {**session_params(h, session), "setupMetadata": metadata}
        with pytest.raises(RequestRefused, match=message):
            await h.methods.cancel_setup({**params, "reason": "cancelled"})
        with pytest.raises(RequestRefused, match=message):
            await h.methods.get_setup(params)
        with pytest.raises(RequestRefused, match=message):
            await h.methods.capture_template(params)
    with pytest.raises(RequestRefused):
        await h.methods.cancel_setup({**session_params(h, session), "providerLeaseId": "../x"})
    assert await h.request_count() == before
    sandbox = await view(h, session["providerLeaseId"])
    assert sandbox is not None and sandbox["status"] == "running"


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


# -- the deadline's warning of an interrupted fork ---------------------------------------------


async def test_a_deadline_names_the_warning_of_the_block_it_interrupted() -> None:
    interrupted = pytest.raises(ProviderError, match=r"within 0\.05 s\. a fork may be left$")
    with interrupted, deadline(0.05, "Forking"), deadline_warning("a fork may be left"):
        await anyio.sleep(5)
    with pytest.raises(ProviderError, match=r"within 0\.05 s\.$"), deadline(0.05, "Forking"):
        with pytest.raises(KeyError), deadline_warning("a fork may be left"):
            raise KeyError("answered")  # a definite answer: nothing is left behind
        with deadline_warning("done"):
            pass
        await anyio.sleep(5)  # the deadline fires outside any warning
    with deadline_warning("outside any deadline"):
        pass
