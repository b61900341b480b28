"""End to end through the REAL Paperclip server 2026.916.1 (docs/protocol.md H9.2) and its CLI.

Installs Node 24 + the server and CLI from npm into <repo>/.cache/paperclip/host on first use,
starts a throwaway system PostgreSQL, the server and the CreateOS emulator, then installs this
checkout as a plugin and walks an operator's first steps with it. Part of the normal suite (CI
runs it); it fails, never skips, when something it needs is missing.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from devtools.e2e_server import (
    PAPERCLIP_VERSION,
    REPO_ROOT,
    PaperclipServer,
    ensure_host_installed,
)
from devtools.emulator_process import EmulatorProcess
from devtools.procfs import wait_until_gone
from provider.config import validate_config
from tests.e2e.inspection import (
    assert_emulator_empty,
    cmdline_mentions,
    json_lines,
    plugin_worker_pids,
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.slow]

MANIFEST = json.loads((REPO_ROOT / "manifest.json").read_text())
PLUGIN_KEY = MANIFEST["id"]
SHIM = REPO_ROOT / "shim.mjs"
SHAPE = "s-1vcpu-1gb"
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
INSTALL_BUDGET_S = 420  # first run only: about 1.5 GB from npm
SCENARIO_BUDGET_S = 240
WORKER_EXIT_S = 20.0


def _sandbox_calls(requests: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    """(method, path, status) of the CreateOS sandbox lifecycle calls in an emulator log."""
    lifecycle = re.compile(r"^/v1/sandboxes(/[^/]+)?$")
    return [
        (r["method"], r["path"], r["status"])
        for r in requests
        if r["method"] in ("POST", "DELETE") and lifecycle.match(r["path"])
    ]


async def _new_requests(emu: EmulatorProcess, seen: int) -> tuple[list[dict[str, Any]], int]:
    requests = await emu.admin.requests(since=seen)
    return requests, max([seen, *(r["seq"] for r in requests)])


async def _logged(server: PaperclipServer, needle: str) -> list[Mapping[str, Any]]:
    """The server's log entries containing ``needle``, waiting for pino to flush one."""
    with anyio.fail_after(10):
        while not (found := json_lines(server.log_text(), needle)):
            await anyio.sleep(0.1)
    return found


async def _scenario(server: PaperclipServer, emu: EmulatorProcess, api_key: str) -> None:
    async with httpx.AsyncClient(base_url=server.api_base, timeout=30) as client:
        health = (await client.get("/api/health")).json()
    assert health["version"] == PAPERCLIP_VERSION
    assert health["deploymentMode"] == "local_trusted"

    # --- install: the host reads package.json, validates the manifest, starts the worker -----
    installed = (await server.cli("plugin", "install", str(REPO_ROOT), "--json")).json()
    assert installed["pluginKey"] == PLUGIN_KEY
    assert installed["status"] == "ready"

    listed = (await server.cli("plugin", "list", "--json")).json()
    ours = [p for p in listed if p["pluginKey"] == PLUGIN_KEY]
    assert len(ours) == 1
    assert ours[0]["status"] == "ready"
    assert ours[0]["version"] == MANIFEST["version"]
    plugin_id = ours[0]["id"]
    text_list = (await server.cli("plugin", "list")).stdout
    assert f"key={PLUGIN_KEY}" in text_list
    assert "status=ready" in text_list

    record = (await server.cli("plugin", "inspect", PLUGIN_KEY, "--json")).json()
    assert record["status"] == "ready"
    assert record["lastError"] is None
    assert record["packagePath"] == str(REPO_ROOT)
    assert record["manifestJson"]["environmentDrivers"] == MANIFEST["environmentDrivers"]
    first_workers = plugin_worker_pids(server.pid or 0, SHIM)
    assert len(first_workers) >= 2, "expected the shim and its Python worker under the server"

    # --- a company and a saved createos environment -----------------------------------------
    company = (
        await server.cli("company", "create", "--json", "--payload-json", '{"name":"Emu Co"}')
    ).json()
    company_id = company["id"]
    config = {"provider": "createos", "apiUrl": f"{emu.base_url}/v1", "apiKey": api_key}
    config["shape"] = SHAPE
    payload = {"name": "createos-emu", "driver": "sandbox", "config": config}
    created = await server.cli(
        "environment", "create", "-C", company_id, "--json", "--payload-json", json.dumps(payload)
    )
    assert api_key not in created.stdout
    environment = created.json()
    stored = environment["config"]
    expected = validate_config({k: v for k, v in config.items() if k != "provider"})
    assert expected["ok"] is True
    normalized = expected["normalizedConfig"]
    assert isinstance(normalized, dict)
    assert stored["apiUrl"] == emu.base_url == normalized["apiUrl"]  # "/v1" dropped
    assert stored["timeoutMs"] == normalized["timeoutMs"] == 300_000
    assert stored["shape"] == SHAPE
    assert stored["reuseLease"] is False
    assert stored["provider"] == "createos"
    assert UUID.match(stored["apiKey"]), "apiKey must be stored as a company-secret reference"
    fetched = (await server.cli("environment", "get", environment["id"], "--json")).json()
    assert fetched["config"] == stored
    company_secrets = (await server.cli("secrets", "list", "-C", company_id, "--json")).json()
    assert stored["apiKey"] in [s["id"] for s in company_secrets]

    # --- probe of the saved environment: the host runs acquire, then release -----------------
    _, seen = await _new_requests(emu, 0)
    probe = (await server.cli("environment", "probe", environment["id"], "--json")).json()
    assert probe["ok"] is True
    sandbox_id = probe["details"]["providerLeaseId"]
    assert sandbox_id.startswith("sb_")
    assert probe["details"]["metadata"]["apiKey"] == stored["apiKey"]
    requests, seen = await _new_requests(emu, seen)
    assert _sandbox_calls(requests) == [
        ("POST", "/v1/sandboxes", 200),
        ("DELETE", f"/v1/sandboxes/{sandbox_id}", 200),
    ]
    leases = (await server.cli("environment", "leases", environment["id"], "--json")).json()
    assert [(x["providerLeaseId"], x["status"]) for x in leases] == [(sandbox_id, "released")]
    assert leases[0]["cleanupStatus"] == "success"  # the host accepted our release receipt

    # --- probe-config: the host calls our environmentProbe with the draft config -------------
    draft = {"driver": "sandbox", "config": {**config, "apiUrl": emu.base_url}}
    probed = await server.cli(
        "environment", "probe-config", "-C", company_id, "--json", "--payload-json",
        json.dumps(draft),
    )  # fmt: skip
    result = probed.json()
    assert result["ok"] is True, result
    assert result["details"]["pluginKey"] == PLUGIN_KEY
    assert "CreateOS" in result["summary"]  # our environmentProbe's summary, not the host's
    requests, seen = await _new_requests(emu, seen)
    calls = _sandbox_calls(requests)
    assert len(calls) == 2
    draft_sandbox = calls[1][1].rsplit("/", 1)[-1]
    assert draft_sandbox.startswith("sb_")
    assert draft_sandbox != sandbox_id
    assert calls == [
        ("POST", "/v1/sandboxes", 200),
        ("DELETE", f"/v1/sandboxes/{draft_sandbox}", 200),
    ]

    # --- an invalid config: our validation message is the HTTP 422 ---------------------------
    bad = {**config, "apiUrl": "http://example.com"}  # fine for the JSON schema, not for us
    message = validate_config({k: v for k, v in bad.items() if k != "provider"})["errors"]
    assert isinstance(message, list)
    bad_payload = {"name": "rejected", "driver": "sandbox", "config": bad}
    refused = await server.cli(
        "environment", "create", "-C", company_id, "--json", "--payload-json",
        json.dumps(bad_payload), check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert f"API error 422: {message[0]}" in refused.stderr
    async with httpx.AsyncClient(base_url=server.api_base, timeout=30) as client:
        answer = await client.post(f"/api/companies/{company_id}/environments", json=bad_payload)
    assert answer.status_code == 422
    assert answer.json()["error"] == message[0]
    assert api_key not in answer.text
    names = [
        e["name"]
        for e in (await server.cli("environment", "list", "-C", company_id, "--json")).json()
    ]
    assert "rejected" not in names

    # --- disable stops the worker cleanly, enable starts a fresh one -------------------------
    await server.cli("plugin", "disable", PLUGIN_KEY)
    after_disable = (await server.cli("plugin", "inspect", PLUGIN_KEY, "--json")).json()
    assert after_disable["status"] == "disabled"
    for pid in first_workers:
        assert await wait_until_gone(pid, WORKER_EXIT_S), f"worker process {pid} outlived disable"
    stopped = await _logged(server, "worker process stopped")
    assert {"pluginId": plugin_id, "code": 0, "signal": None}.items() <= stopped[-1].items()

    await server.cli("plugin", "enable", PLUGIN_KEY)
    after_enable = (await server.cli("plugin", "inspect", PLUGIN_KEY, "--json")).json()
    assert after_enable["status"] == "ready"
    assert after_enable["lastError"] is None
    second_workers = plugin_worker_pids(server.pid or 0, SHIM)
    assert len(second_workers) >= 2
    assert not set(second_workers) & set(first_workers)
    again = await server.cli(
        "environment", "probe-config", "-C", company_id, "--json", "--payload-json",
        json.dumps(draft),
    )  # fmt: skip
    assert again.json()["ok"] is True  # the fresh worker answers
    log = server.log_text()
    assert "worker process crashed" not in log
    assert "worker did not exit after shutdown RPC" not in log  # no SIGTERM/SIGKILL needed


# The test's own budgets run out first, with their message; 120 s for the rest.
@pytest.mark.timeout(INSTALL_BUDGET_S + SCENARIO_BUDGET_S + 120)
async def test_the_real_server_installs_configures_probes_and_restarts_our_plugin() -> None:
    started = time.monotonic()
    with anyio.fail_after(INSTALL_BUDGET_S):
        await ensure_host_installed()
    root = Path(tempfile.mkdtemp(prefix="paperclip-e2e-"))
    root.chmod(0o711)  # the postgres user must reach its cluster folder below
    api_key = f"emu-key-{secrets.token_hex(8)}"
    server_log = ""
    timings: dict[str, float] = {}
    try:
        with anyio.fail_after(SCENARIO_BUDGET_S):
            async with EmulatorProcess(root / "emulator", api_key) as emu:
                async with PaperclipServer(root / "paperclip", secrets=[api_key]) as server:
                    await _scenario(server, emu, api_key)
                server_log = server.raw_log_text()  # unredacted: the key check must be able to fail
                timings = server.timings
                assert server.leftover_pids == [], "processes outlived the server's SIGTERM"
                await assert_emulator_empty(emu, "smoke")
            assert emu.leftover_pids == []
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert not root.exists()
    assert cmdline_mentions(str(root)) == [], "a process still refers to the smoke's folder"
    assert "Server startup recovery complete" in server_log
    assert api_key not in server_log
    print(f"\ne2e full server: {time.monotonic() - started:.1f} s, start-up {timings}")
