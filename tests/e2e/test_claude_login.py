"""Claude's setup-token login end to end, through the REAL Paperclip server.

The host's setup-token login (``POST /api/companies/:id/setup-token-login-sessions``, the **Log
in** button of a ``claude_local`` agent) acquires a lease with ``requestedExpiresAt`` (the
session's deadline, 5 minutes) and fails closed unless the lease answers an ``expiresAt`` at or
before it: our worker starts the sandbox's expiry guard and answers the deadline. The login
terminal then runs ``claude setup-token``, here the stub of ``agent-image/``
(``opt/paperclip-stub/bin/claude-setup-token``, on ``PATH`` as ``/usr/local/bin/claude``): it
prints the sign-in URL and the code prompt, reads the code the test submits through the host,
prints the token. The host must see the login complete, store the credential, and release the
lease: its sandbox is gone long before the deadline. Fails, never skips, when Node or the server
cannot be installed.
"""

from __future__ import annotations

import secrets
import time
from datetime import datetime
from typing import Any

import anyio
import httpx
import pytest

from devtools.agent_heartbeat import STUB_IMAGE, AgentSite
from devtools.e2e_server import REPO_ROOT, PaperclipServer, ensure_host_installed
from devtools.emulator_process import EmulatorProcess
from tests.e2e.stub_server import run_on_stub_server

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.slow]

INSTALL_BUDGET_S = 420
SCENARIO_BUDGET_S = 300
STEP_S = 60
AUTH_HOST = "https://claude.ai/oauth/authorize?"


def _json(answer: httpx.Response, expected: int) -> Any:
    assert answer.status_code == expected, (answer.status_code, answer.text)
    return answer.json()


async def _until(client: httpx.AsyncClient, path: str, ready: Any) -> Any:
    """GET ``path`` until ``ready(answer)`` holds; returns that answer's JSON."""
    with anyio.fail_after(STEP_S):
        while True:
            answer = await client.get(path)
            if ready(answer):
                return answer.json()
            await anyio.sleep(0.2)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def _scenario(server: PaperclipServer, emu: EmulatorProcess, api_key: str) -> None:
    await server.cli("plugin", "install", str(REPO_ROOT), "--json")
    async with httpx.AsyncClient(base_url=server.api_base, timeout=60) as client:
        site = await AgentSite.create(server, client, "Login Co")
        config = {"apiUrl": emu.base_url, "apiKey": api_key, "shape": "s-1vcpu-1gb"}
        environment_id = await site.createos_environment(
            "createos-login", {**config, "rootfs": STUB_IMAGE}
        )
        sessions = f"/api/companies/{site.company_id}/setup-token-login-sessions"
        started = _json(
            await client.post(
                sessions, json={"adapterType": "claude_local", "environmentId": environment_id}
            ),
            201,
        )
        session = f"{sessions}/{started['sessionId']}"
        deadline = _epoch(started["expiresAt"])
        prompt = await _until(client, f"{session}/prompt", lambda a: a.status_code == 200)
        assert prompt["authorizationUrl"].startswith(AUTH_HOST), prompt

        [lease] = await site.leases(environment_id)
        assert lease["status"] == "active"
        assert _epoch(lease["expiresAt"]) <= deadline  # the host's own check passed
        sandbox_id = lease["providerLeaseId"]
        history = await emu.admin.process_history()
        assert any("setup-token" in " ".join(p.get("args") or []) for p in history), history

        code = f"stubcode{secrets.token_hex(8)}"
        _json(await client.post(f"{session}/code", json={"browserCode": code}), 200)
        done = await _until(
            client,
            session,
            lambda a: a.json().get("status") not in ("starting", "waiting_for_user"),
        )
        assert done["status"] == "authenticated", done
        claim = _json(await client.post(f"{session}/completion"), 200)
        assert claim["storedSessionId"], claim

        released = await site.wait_released(environment_id, 1)
        assert released[0]["providerLeaseId"] == sandbox_id
    assert time.time() < deadline  # gone by the release, well before the deadline
    state = await emu.admin.state()
    assert [s for s in state["sandboxes"] if s["id"] == sandbox_id] == []
    deletes = [r for r in await emu.admin.requests() if r["method"] == "DELETE"]
    assert [r["path"] for r in deletes] == [f"/v1/sandboxes/{sandbox_id}"]


async def test_claude_setup_token_login_completes_in_a_sandbox_with_a_deadline() -> None:
    with anyio.fail_after(INSTALL_BUDGET_S):
        await ensure_host_installed()
    started = time.monotonic()
    server_log = await run_on_stub_server(
        "paperclip-login-", "the login", SCENARIO_BUDGET_S, _scenario
    )
    assert "sk-ant-oat01-" not in server_log, "the token reached a log line"
    print(f"\ne2e Claude login: {time.monotonic() - started:.1f} s")
