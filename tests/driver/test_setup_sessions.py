"""Interactive setup sessions through the real driver on the emulator (docs/protocol.md 8,
checklist 81 and 84), and the host's redaction rules applied to our setup and capture metadata
(docs/protocol.md H10.4)."""

from __future__ import annotations

import json
import re
import shlex
import uuid
from typing import Any

import pytest

from provider.driver.setup.templates import SETUP_METADATA_KEYS, connection_payload, endpoint_digest
from provider.errors import RequestRefused
from tests.driver.conftest import SHAPE, Harness
from tests.driver.templates_support import (
    EXPIRES_AT,
    MARKER_PATH,
    SETUP_FILE,
    UUID,
    api,
    fork_bodies,
    gone,
    host_redact,
    record_bodies,
    session_params,
    sh,
    start,
    start_params,
    template,
    view,
)

pytestmark = pytest.mark.anyio


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
    assert fork_bodies(sent, ref) == [fork_body]
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
