"""Custom images end to end through the REAL Paperclip server 2026.916.1 (docs/protocol.md H10.4,
8): the operator's whole loop, through the server's own HTTP API.

With our plugin installed from this checkout and a createos environment on the emulator, a setup
session is started (``POST /api/environments/:id/custom-image-setup-sessions``), its connection
payload read (``GET /api/environment-custom-image-setup-sessions/:sessionId``), and the command it
names, the real attach helper, is run in a real pseudo-terminal with the key in the helper's
environment only, to write a file in the setup sandbox. Finishing the session (``POST
.../:sessionId/finish``) captures the sandbox as the environment's active template. A probe of the
environment (``POST /api/environments/:id/probe``) then leases a fork of that template, and the
file is read from the fork while it lives (its DELETE is held back by an emulator fault so it
can be looked at). Disabling the template with provider deletion (``DELETE
/api/environments/:id/custom-image-template?deleteProviderTemplate=true``) deletes the template
sandbox. Nothing is left behind and the key never reaches the server's log. Fails, never skips,
when Node or the server cannot be installed.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from devtools.agent_heartbeat import AgentSite, scratch_root
from devtools.e2e_server import REPO_ROOT, PaperclipServer, ensure_host_installed
from devtools.emulator_process import EmulatorProcess
from provider.driver.setup.templates import endpoint_digest
from tests.e2e.inspection import assert_emulator_empty, cmdline_mentions
from tests.shell.local_pty import helper_env, local_terminal

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.slow]

INSTALL_BUDGET_S = 420  # first run only: about 1.5 GB from npm
SCENARIO_BUDGET_S = 240
MANIFEST = json.loads((REPO_ROOT / "manifest.json").read_text())
SETUP_FILE = "/paperclip-workspace/setup-file.txt"
PROMPT = rb"bash-[0-9.]+# "
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
DELETE_HOLD_MS = 6000  # how long the emulator holds back the fork's DELETE


def _ok(answer: httpx.Response, status: int = 200) -> Any:
    assert answer.status_code == status, f"{answer.request.url.path}: {answer.text[:800]}"
    return answer.json()


async def _sandbox(emu: EmulatorProcess, api_key: str, sandbox_id: str) -> dict[str, Any] | None:
    async with httpx.AsyncClient(
        base_url=emu.base_url, headers={"X-Api-Key": api_key}, timeout=30
    ) as client:
        answer = await client.get(f"/v1/sandboxes/{sandbox_id}")
    return None if answer.status_code == 404 else dict(answer.json()["data"])


async def _read_file(emu: EmulatorProcess, api_key: str, sandbox_id: str) -> bytes:
    async with httpx.AsyncClient(
        base_url=emu.base_url, headers={"X-Api-Key": api_key}, timeout=30
    ) as client:
        answer = await client.get(f"/v1/sandboxes/{sandbox_id}/files", params={"path": SETUP_FILE})
    assert answer.status_code == 200, answer.text
    return answer.content


async def _alive_processes(emu: EmulatorProcess, sandbox_id: str) -> list[dict[str, Any]]:
    state = await emu.admin.state()
    return [p for p in state["processes"] if p["sandbox_id"] == sandbox_id and p["tree_alive"]]


async def _prepare_by_hand(command: str, api_key: str, tmp: Path) -> bytes:
    """The operator pastes the payload's command into a terminal with CREATEOS_API_KEY set
    there, types a command that leaves a file, and exits. Answers what the file must hold."""
    argv = shlex.split(command)
    assert argv[:4] == ["python3", "-m", "provider", "shell"], command
    # python3 is this checkout's venv interpreter (sys.executable) in local_terminal
    async with local_terminal(argv[4:], helper_env(tmp, api_key), rows=24, cols=80) as term:
        at = await term.expect(rb"provider shell: connected to sandbox ", timeout=60)
        at = await term.expect(PROMPT, at, timeout=60)
        typed = f"pwd > {SETUP_FILE} && echo installed-by-the-operator >> {SETUP_FILE}"
        term.type(typed.encode() + b"\r")
        at = await term.expect(PROMPT, at)
        term.type(b"exit 0\r")
        assert await term.wait(60) == 0
        await term.expect(rb"disconnected: the remote shell exited with code 0")
        assert api_key.encode() not in term.output
    return b"/paperclip-workspace\ninstalled-by-the-operator\n"


async def _probe_and_read_the_fork(
    client: httpx.AsyncClient,
    emu: EmulatorProcess,
    api_key: str,
    environment_id: str,
    company_id: str,
    template_ref: str,
) -> tuple[dict[str, Any], str, bytes]:
    """Probe the environment (the host leases a fork of the active template and releases it);
    while the fork lives, read the setup file from it. Answers (probe, fork id, file)."""
    fork_delete = rf"^/v1/sandboxes/(?!{re.escape(template_ref)}$)[^/]+$"
    await emu.admin.add_fault("DELETE", fork_delete, times=1, delay_ms=DELETE_HOLD_MS)
    probe: dict[str, Any] = {}

    async def run_probe() -> None:
        answer = await client.post(
            f"/api/environments/{environment_id}/probe", params={"companyId": company_id}
        )
        probe.update(_ok(answer))

    fork_id = ""
    content = b""
    async with anyio.create_task_group() as tg:
        tg.start_soon(run_probe)
        with anyio.fail_after(90):
            while not fork_id:
                for row in (await emu.admin.state())["sandboxes"]:
                    if row["id"] != template_ref and row["status"] == "running":
                        fork_id = row["id"]
                if not fork_id:
                    await anyio.sleep(0.05)
        content = await _read_file(emu, api_key, fork_id)
    await emu.admin.clear_faults()
    return probe, fork_id, content


async def _scenario(server: PaperclipServer, emu: EmulatorProcess, api_key: str, tmp: Path) -> None:
    installed = (await server.cli("plugin", "install", str(REPO_ROOT), "--json")).json()
    assert installed["status"] == "ready"
    record = (await server.cli("plugin", "inspect", installed["pluginKey"], "--json")).json()
    # the host's manifest validation kept the setup and template declarations as written
    assert record["manifestJson"]["environmentDrivers"] == MANIFEST["environmentDrivers"]
    async with httpx.AsyncClient(base_url=server.api_base, timeout=120) as client:
        site = await AgentSite.create(server, client, "Template Co")
        company = {"companyId": site.company_id}
        config = {"apiUrl": emu.base_url, "apiKey": api_key, "shape": "s-1vcpu-1gb"}
        environment_id = await site.createos_environment("createos-templates", config)

        capabilities = _ok(
            await client.get(f"/api/companies/{site.company_id}/environments/capabilities")
        )
        ours = capabilities["sandboxProviders"]["createos"]
        assert ours["supportsInteractiveSetup"] is True
        assert ours["interactiveSetupConnectionTypes"] == ["createos_shell"]
        assert ours["supportsTemplateCapture"] is True
        assert ours["supportsTemplateDelete"] is True
        assert ours["templateRefKind"] == "snapshot"
        overview_path = f"/api/environments/{environment_id}/custom-image-template"
        overview = _ok(await client.get(overview_path, params=company))
        assert overview["activeTemplate"] is None and overview["activeSession"] is None

        # --- start: the host calls environmentStartInteractiveSetup ------------------------
        seen = len(await emu.admin.requests())
        started = _ok(
            await client.post(
                f"/api/environments/{environment_id}/custom-image-setup-sessions",
                params=company,
                json={},
            ),
            201,
        )
        assert api_key not in json.dumps(started)
        session = started["session"]
        session_id = session["id"]
        sandbox_id = session["providerLeaseId"]
        assert session["status"] == "waiting_for_user"
        assert sandbox_id.startswith("sb_")
        # only the summary's type (ours is not one the host knows) and label are stored
        assert session["connectionSummary"]["type"] == "unknown"
        metadata = session["metadata"]
        assert metadata["provider"] == "createos"
        assert metadata["companyId"] == site.company_id
        assert metadata["environmentId"] == environment_id
        assert metadata["endpointDigest"] == endpoint_digest(emu.base_url)
        assert UUID.match(metadata["setupMarker"])  # survived the host's redaction
        assert isinstance(metadata["expiresAt"], str) and metadata["expiresAt"] != "[redacted]"
        creates = [
            r
            for r in (await emu.admin.requests())[seen:]
            if (r["method"], r["path"]) == ("POST", "/v1/sandboxes")
        ]
        assert [r["status"] for r in creates] == [200]
        sandbox = await _sandbox(emu, api_key, sandbox_id)
        assert sandbox is not None and sandbox["status"] == "running"
        assert sandbox["name"].startswith("pc-setup-")

        # --- read the session: the operator's connection payload ---------------------------
        read = _ok(await client.get(f"/api/environment-custom-image-setup-sessions/{session_id}"))
        assert api_key not in json.dumps(read)
        payload = read["connectionPayload"]
        assert payload == started["connectionPayload"]
        assert payload["type"] == "createos_shell"
        command = payload["command"]
        assert emu.base_url in command and sandbox_id in command
        assert shlex.split(command)[-3:] == ["--api-url", emu.base_url, sandbox_id]

        expected = await _prepare_by_hand(command, api_key, tmp)
        assert await _read_file(emu, api_key, sandbox_id) == expected

        # --- finish: capture, then the host's cancel with reason "promoted" ----------------
        finished = _ok(
            await client.post(
                f"/api/environment-custom-image-setup-sessions/{session_id}/finish", json={}
            )
        )
        assert finished["session"]["status"] == "promoted"
        template = finished["template"]
        assert template["status"] == "active"
        assert template["templateKind"] == "snapshot"
        assert template["templateRef"] == sandbox_id  # the setup sandbox is the template
        captured = template["metadata"]
        assert captured["provider"] == "createos"
        assert captured["environmentId"] == environment_id
        assert captured["endpointDigest"] == endpoint_digest(emu.base_url)
        paused = await _sandbox(emu, api_key, sandbox_id)
        assert paused is not None and paused["status"] == "paused"
        assert await _alive_processes(emu, sandbox_id) == []
        log = await emu.admin.requests()
        assert ("DELETE", f"/v1/sandboxes/{sandbox_id}") not in [
            (r["method"], r["path"]) for r in log
        ], "the promoted cancel must keep the template"
        overview = _ok(await client.get(overview_path, params=company))
        assert overview["activeTemplate"]["id"] == template["id"]
        assert overview["activeTemplateMatchesConfig"] is True
        assert overview["activeSession"] is None

        # --- use: a probe leases a fork of the template, which holds the file --------------
        seen = len(log)
        probe, fork_id, content = await _probe_and_read_the_fork(
            client, emu, api_key, environment_id, site.company_id, sandbox_id
        )
        assert probe["ok"] is True, probe
        assert probe["details"]["providerLeaseId"] == fork_id
        assert probe["details"]["metadata"]["snapshot"] == sandbox_id
        assert probe["details"]["metadata"]["rootfs"] is None
        assert content == expected
        calls = [(r["method"], r["path"], r["status"]) for r in (await emu.admin.requests())[seen:]]
        assert ("POST", f"/v1/sandboxes/{sandbox_id}/fork", 200) in calls
        assert not [c for c in calls if c[:2] == ("POST", "/v1/sandboxes")], "nothing booted"
        assert ("DELETE", f"/v1/sandboxes/{fork_id}", 200) in calls
        fork = await _sandbox(emu, api_key, fork_id)
        assert fork is None or fork["status"] == "destroyed", "the probe's fork was deleted"
        still = await _sandbox(emu, api_key, sandbox_id)
        assert still is not None and still["status"] == "paused"

        # --- disable with provider deletion: environmentDeleteTemplate ---------------------
        seen = len(await emu.admin.requests())
        disabled = _ok(
            await client.delete(overview_path, params={**company, "deleteProviderTemplate": "true"})
        )
        assert disabled["id"] == template["id"] and disabled["status"] == "revoked"
        calls = [(r["method"], r["path"], r["status"]) for r in (await emu.admin.requests())[seen:]]
        assert ("DELETE", f"/v1/sandboxes/{sandbox_id}", 200) in calls
        gone = await _sandbox(emu, api_key, sandbox_id)
        assert gone is None or gone["status"] == "destroyed"
        overview = _ok(await client.get(overview_path, params=company))
        assert overview["activeTemplate"] is None
        assert overview["latestSession"]["status"] == "promoted"
    state = await emu.admin.state()
    assert state["sandboxes"] == [], "a sandbox outlived the scenario"


# The test's own budgets run out first, with their message; 120 s for the rest.
@pytest.mark.timeout(INSTALL_BUDGET_S + SCENARIO_BUDGET_S + 120)
async def test_an_operator_captures_a_template_that_runs_fork_and_deletes_it() -> None:
    started = time.monotonic()
    with anyio.fail_after(INSTALL_BUDGET_S):
        await ensure_host_installed()
    root = scratch_root("paperclip-templates-")
    api_key = f"emu-key-{secrets.token_hex(8)}"
    server_log = ""
    try:
        with anyio.fail_after(SCENARIO_BUDGET_S):
            async with EmulatorProcess(root / "emulator", api_key) as emu:
                async with PaperclipServer(root / "paperclip", secrets=[api_key]) as server:
                    await _scenario(server, emu, api_key, root / "operator")
                server_log = server.raw_log_text()  # unredacted: the key check must be able to fail
                assert server.leftover_pids == [], "processes outlived the server's SIGTERM"
                await assert_emulator_empty(emu, "scenario")
            assert emu.leftover_pids == []
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert cmdline_mentions(str(root)) == [], "a process still refers to the test's folder"
    assert "Server startup recovery complete" in server_log
    assert api_key not in server_log
    assert "worker process crashed" not in server_log
    print(f"\ne2e custom-image templates: {time.monotonic() - started:.1f} s")
