"""Checklist 82 end to end on the driver: a setup session is started, the operator runs the REAL
attach helper named by the session's ``connectionPayload.command`` in a real pseudo-terminal
and prepares a file by typing, then the session is captured (the sandbox, paused with no
process left, *is* the template), the host's ``promoted`` cancel sends nothing, a lease of the
bound environment forks the template and finds the file, and the template is deleted
(docs/protocol.md 8, docs/protocol.md H10.4)."""

from __future__ import annotations

import json
import shlex
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.driver.conftest import Harness
from tests.shell.local_pty import helper_env, local_terminal

pytestmark = pytest.mark.anyio

KEY = "test-key"  # the harness's emulator key (Harness.config)
EXPIRES_AT = "2030-01-01T00:00:00.000Z"
SETUP_FILE = "/paperclip-workspace/setup-file.txt"
PROMPT = rb"bash-[0-9.]+# "


def helper_argv(command: str) -> list[str]:
    """The payload's command as this test runs it: ``python3`` is this interpreter (the
    checkout's venv), everything else exactly as the operator is told to type it."""
    argv = shlex.split(command)
    assert argv[:4] == ["python3", "-m", "provider", "shell"], command
    return [sys.executable, *argv[1:]]


async def sandbox_view(h: Harness, sandbox_id: str) -> dict[str, Any] | None:
    async with httpx.AsyncClient(
        base_url=h.emulator.base_url, headers={"X-Api-Key": KEY}, timeout=30
    ) as client:
        answer = await client.get(f"/v1/sandboxes/{sandbox_id}")
    if answer.status_code == 404:
        return None
    return dict(answer.json()["data"])


async def read_file(h: Harness, sandbox_id: str, path: str) -> bytes:
    async with httpx.AsyncClient(
        base_url=h.emulator.base_url, headers={"X-Api-Key": KEY}, timeout=30
    ) as client:
        answer = await client.get(f"/v1/sandboxes/{sandbox_id}/files", params={"path": path})
    assert answer.status_code == 200, answer.text
    return answer.content


async def processes_of(h: Harness, sandbox_id: str) -> list[dict[str, Any]]:
    state = await h.emulator.admin.state()
    return [p for p in state["processes"] if p["sandbox_id"] == sandbox_id]


async def test_the_attach_helper_prepares_a_template_that_a_lease_forks(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    session = await h.methods.start_setup(
        {
            **h.call(),
            "sessionId": str(uuid.uuid4()),
            "sourceTemplateRef": None,
            "sourceTemplateKind": None,
            "connectionExpiresInMinutes": 15,
            "expiresAt": EXPIRES_AT,
        }
    )
    sandbox_id = session["providerLeaseId"]
    assert session["status"] == "waiting_for_user"
    payload = session["connectionPayload"]
    assert payload["type"] == "createos_shell"
    assert KEY not in json.dumps(session)  # the key is never in the payload
    argv = helper_argv(payload["command"])
    assert argv[-3:] == ["--api-url", h.emulator.base_url, sandbox_id]

    # The operator's terminal: the key in the helper's environment only.
    env = helper_env(tmp_path, KEY)
    async with local_terminal(argv[4:], env, rows=24, cols=80) as term:
        at = await term.expect(rb"provider shell: connected to sandbox ")
        at = await term.expect(PROMPT, at)
        command = f"pwd > {SETUP_FILE} && echo prepared-by-hand >> {SETUP_FILE}"
        term.type(command.encode() + b"\r")
        at = await term.expect(PROMPT, at)
        assert await processes_of(h, sandbox_id)  # the helper's shell is running remotely
        term.type(b"exit 0\r")
        assert await term.wait() == 0
        await term.expect(rb"disconnected: the remote shell exited with code 0")
        assert KEY.encode() not in term.output
    expected = b"/paperclip-workspace\nprepared-by-hand\n"
    assert await read_file(h, sandbox_id, SETUP_FILE) == expected

    # Finish: the host's capture, then its cancel with reason "promoted".
    setup_metadata = {**session["metadata"], "setupRpcCompanyId": h.company_id}
    captured = await h.methods.capture_template(
        {
            **h.call(),
            "providerLeaseId": sandbox_id,
            "setupMetadata": setup_metadata,
            "sourceTemplateRef": None,
            "previousTemplateRef": None,
            "templateLabel": "paperclip-env-1-setup",
            "timeoutMs": 60_000,
        }
    )
    assert {k: captured[k] for k in ("templateRef", "templateKind")} == {
        "templateRef": sandbox_id,
        "templateKind": "snapshot",
    }
    template = await sandbox_view(h, sandbox_id)
    assert template is not None and template["status"] == "paused"
    rows = await processes_of(h, sandbox_id)
    assert rows and [p for p in rows if p["tree_alive"]] == []  # no process left

    before = await h.request_count()
    cancelled = await h.methods.cancel_setup(
        {
            **h.call(),
            "providerLeaseId": sandbox_id,
            "setupMetadata": setup_metadata,
            "reason": "promoted",
        }
    )
    assert cancelled == {
        "status": "cancelled",
        "metadata": {"provider": "createos", "templateKept": True},
    }
    assert await h.request_count() == before  # no request at all

    # A run of the bound environment: the host sets config.snapshot = templateRef.
    ref = captured["templateRef"]
    lease = await h.acquire(snapshot=ref)
    lease_id = lease["providerLeaseId"]
    assert lease_id != ref and lease["metadata"]["snapshot"] == ref
    result = await h.methods.execute(
        {**h.with_lease(lease, snapshot=ref), "command": "cat", "args": [SETUP_FILE]}
    )
    assert result["exitCode"] == 0 and result["stdout"].encode() == expected
    released = await h.methods.release(h.lease_ref(lease, snapshot=ref))
    assert released is not None and released["state"] == "destroyed"
    template = await sandbox_view(h, ref)
    assert template is not None and template["status"] == "paused"  # forks leave it alone

    deleted = await h.methods.delete_template(
        {
            **h.call(),
            "templateRef": ref,
            "templateKind": captured["templateKind"],
            "metadata": {**captured["metadata"], "setupRpcCompanyId": h.company_id},
            "reason": "disabled",
        }
    )
    assert deleted == {"deleted": True}
    gone = await sandbox_view(h, ref)
    assert gone is None or gone["status"] == "destroyed"
    assert (await h.emulator.admin.state())["sandboxes"] == []
