"""A real agent heartbeat inside a CreateOS (emulator) sandbox, through the REAL Paperclip server.

The server (2026.916.1, installed from npm on first use) leases a sandbox from our plugin for a
``claude_local`` agent whose CLI is the stub in ``agent-image/`` (served by the emulator as an
image, so nothing is written into the host's system folders), syncs the workspace and runtime
assets in, runs the CLI there with live run logs, serves its Paperclip API call through the
callback bridge, syncs the workspace back and releases the lease. Three heartbeats: the second
sees the first one's file; the third runs with the instance's experimental duplex bridge on, so
its API call travels over one of our duplex channels instead of the polled request folder.
``reuseLease`` is on, yet a plain heartbeat has no execution workspace, so its lease is not
reusable and every sandbox is deleted (docs/protocol.md 2.10.1). Fails, never skips, when
Node or the server cannot be installed.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from devtools.agent_heartbeat import (
    STUB_COMMAND,
    STUB_FILE,
    STUB_IMAGE,
    AgentSite,
    HeartbeatRun,
)
from devtools.e2e_server import REPO_ROOT, PaperclipServer, ensure_host_installed
from devtools.emulator_process import EmulatorProcess
from tests.e2e.stub_server import run_on_stub_server

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.slow]

INSTALL_BUDGET_S = 420  # first run only: about 1.5 GB from npm
SCENARIO_BUDGET_S = 600  # two heartbeats at default pacing: about 90 s each before the fast path
ROOT = "/paperclip-workspace"
LIFECYCLE = re.compile(r"^/v1/sandboxes(/sb_[^/]+)?$")
PROCESS_CREATE = re.compile(r"^/v1/sandboxes/(sb_[^/]+)/(?:processes|exec)$")


def _lifecycle(requests: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (r["method"], r["path"])
        for r in requests
        if r["method"] in ("POST", "DELETE") and LIFECYCLE.match(r["path"])
    ]


async def commands_run(emu: Any) -> list[dict[str, Any]]:
    """Every command the emulator ran, in order: its execs (each ordinary command is one) and
    its managed processes (duplex channels, login terminals), by start time."""
    execs = await emu.admin.exec_history()
    processes = await emu.admin.process_history()
    return sorted([*execs, *processes], key=lambda entry: float(entry.get("time", 0)))


def _process_sandboxes(requests: list[dict[str, Any]]) -> set[str]:
    """The sandboxes commands ran in: a streamed exec or a process create names its sandbox."""
    found = set()
    for r in requests:
        match = PROCESS_CREATE.match(r["path"])
        if r["method"] == "POST" and match:
            found.add(match.group(1))
    return found


def _polls_request_folder(process: dict[str, Any]) -> bool:
    """A command of the host's file bridge listing its request folder (docs/protocol.md A3.5)."""
    text = " ".join(process.get("args") or [])
    return "for file in" in text and "requests" in text and "*.json" in text


def _runs_duplex_gateway(process: dict[str, Any]) -> bool:
    """A duplex channel's process (``bash -c``; commands run under ``bash -lc``) running the
    host's bridge gateway."""
    args = process.get("args", [])
    return args[:1] == ["-c"] and "paperclip-bridge-server.mjs" in " ".join(args)


def _assert_ran_in_sandbox(run: HeartbeatRun, number: int) -> None:
    assert run.status == "succeeded", run.error
    assert run.stub_values("cwd") == [ROOT]
    assert run.stub_values("heartbeat") == [str(number)]
    assert run.stub_values("bridge-status") == ["200"], "the agent's API call through the bridge"
    stdout = run.stdout()
    assert '"type":"result","subtype":"success"' in stdout
    assert "Syncing workspace to environment" in stdout  # the host drove our sync verbs
    assert run.record["exitCode"] == 0
    # Live run log: the host writes our execute.log chunks as they come (streamRunLogs false,
    # our stored default), so the stub's first lines are readable while it still sleeps.
    assert run.seen_while_running("stub-cwd="), "the agent's output did not stream live"
    assert "Sandbox run log streaming enabled" not in stdout  # no log-tail commands


async def _scenario(server: PaperclipServer, emu: EmulatorProcess, api_key: str) -> None:
    await server.cli("plugin", "install", str(REPO_ROOT), "--json")
    async with httpx.AsyncClient(base_url=server.api_base, timeout=60) as client:
        site = await AgentSite.create(server, client, "Heartbeat Co")
        config = {
            "apiUrl": emu.base_url,
            "apiKey": api_key,
            "shape": "s-1vcpu-1gb",
            "rootfs": STUB_IMAGE,
            "reuseLease": True,
        }
        environment_id = await site.createos_environment("createos-emu", config)
        stored = (await client.get(f"/api/environments/{environment_id}")).json()["config"]
        assert stored["streamRunLogs"] is False  # our validation's default, kept by the host
        assert stored["rootfs"] == STUB_IMAGE
        agent_id = await site.agent("stub", STUB_COMMAND, environment_id=environment_id)
        workspace = site.workspace(agent_id)

        first = await site.heartbeat(agent_id)
        _assert_ran_in_sandbox(first, 1)
        await site.wait_released(environment_id, 1)
        lines = (workspace / STUB_FILE).read_text().splitlines()
        assert len(lines) == 1
        ran_in, _, hostname = lines[0].partition(" on ")
        assert ran_in == f"heartbeat 1 ran in {ROOT}"
        assert hostname.startswith("pc-"), "the guest's hostname is the sandbox's name token"
        assert hostname != socket.gethostname()
        assert not Path(ROOT).exists(), "the stub must not have run on the host"

        second = await site.heartbeat(agent_id)
        _assert_ran_in_sandbox(second, 2)  # it found the first heartbeat's file
        leases = await site.wait_released(environment_id, 2)
        assert [x["cleanupStatus"] for x in leases] == ["success", "success"]
        lines = (workspace / STUB_FILE).read_text().splitlines()
        assert [line.split(" on ")[0] for line in lines] == [
            f"heartbeat 1 ran in {ROOT}",
            f"heartbeat 2 ran in {ROOT}",
        ]
        file_bridge = await commands_run(emu)
        assert [first.stub_values("bridge-mode"), second.stub_values("bridge-mode")] == [
            ["queue_v1"],
            ["queue_v1"],
        ]
        assert any(_polls_request_folder(p) for p in file_bridge), "the file bridge polled"
        assert not any(_runs_duplex_gateway(p) for p in file_bridge)

        # The instance's experimental duplex bridge: the agent's API call travels over one
        # duplex channel of ours, and no command polls a request folder any more.
        await site.set_duplex_bridge(True)
        third = await site.heartbeat(agent_id)
        _assert_ran_in_sandbox(third, 3)
        assert third.stub_values("bridge-mode") == ["http2_v1"]
        transport = await site.bridge_transport(third.run_id)
        assert transport is not None, "no sandbox.duplex.transport event"
        assert (transport.get("transport"), transport.get("outcome")) == ("http2", "ok")
        leases = await site.wait_released(environment_id, 3)
        assert [x["cleanupStatus"] for x in leases] == ["success"] * 3
        duplex_bridge = (await commands_run(emu))[len(file_bridge) :]
        assert [p for p in duplex_bridge if _runs_duplex_gateway(p)], "no duplex channel ran"
        assert len([p for p in duplex_bridge if _runs_duplex_gateway(p)]) == 1
        assert not [p for p in duplex_bridge if _polls_request_folder(p)]

    requests = await emu.admin.requests()
    calls = _lifecycle(requests)
    created = [path for method, path in calls if method == "POST"]
    sandboxes = [x["providerLeaseId"] for x in leases]
    assert created == ["/v1/sandboxes"] * 3
    assert sorted(path for method, path in calls if method == "DELETE") == sorted(
        f"/v1/sandboxes/{sid}" for sid in sandboxes
    ), "a plain heartbeat's lease is not reusable: deleted on release even with reuseLease"
    assert _process_sandboxes(requests) == set(sandboxes), "the agent's commands ran in them"
    assert not any(r["path"].endswith("/pause") for r in requests)
    state = await emu.admin.state()
    assert state["sandboxes"] == [], "a sandbox outlived the heartbeats"


# The test's own budgets run out first, with their message; 120 s for the rest.
@pytest.mark.timeout(INSTALL_BUDGET_S + SCENARIO_BUDGET_S + 120)
async def test_an_agent_heartbeat_runs_in_the_sandbox_and_leaves_nothing_behind() -> None:
    started = time.monotonic()
    with anyio.fail_after(INSTALL_BUDGET_S):
        await ensure_host_installed()
    server_log = await run_on_stub_server(
        "paperclip-heartbeat-", "heartbeats", SCENARIO_BUDGET_S, _scenario
    )
    assert "worker process crashed" not in server_log
    print(f"\ne2e agent heartbeats: {time.monotonic() - started:.1f} s")
