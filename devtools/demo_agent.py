"""``python -m devtools.demo_agent``: one real agent heartbeat in a sandbox, live.

Starts the bundled CreateOS emulator (serving the stub agent image), the full Paperclip server
(2026.916.1, installed from npm into ``.cache/paperclip/host`` on first use, about 2 minutes)
on a throwaway PostgreSQL, installs this checkout as a plugin, creates a company, a ``createos``
environment and a ``claude_local`` agent whose CLI is the stub, and invokes one heartbeat. The
run log prints as the host writes it; a summary closes the transcript: status, wall time, API
requests, the sandbox's life (created, deleted), the stub's file in the agent's host workspace.
Everything it started is stopped and its temp folder removed (``--keep`` keeps the folder).
Exit status 0 when the heartbeat succeeded and nothing was left behind, 1 otherwise, 130 on
Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import sys
import time
from typing import Any

import anyio
import httpx

from devtools.agent_heartbeat import (
    STUB_COMMAND,
    STUB_FILE,
    STUB_IMAGE,
    AgentSite,
    agent_server_env,
    scratch_root,
    stage_stub_image,
)
from devtools.e2e_server import REPO_ROOT, E2EError, PaperclipServer
from devtools.emulator_process import EmulatorProcess


def say(text: str) -> None:
    print(text, flush=True)


def print_log_entry(entry: dict[str, Any]) -> None:
    for line in str(entry.get("chunk", "")).splitlines():
        say(f"  {entry.get('stream', '?'):6} | {line[:160]}")


async def run(keep: bool) -> int:
    root = scratch_root("paperclip-demo-agent-")
    key = f"demo-{secrets.token_hex(8)}"
    ok = False
    try:
        say("starting the CreateOS emulator and the Paperclip server (first run installs it)")
        started = time.monotonic()
        images = {STUB_IMAGE: stage_stub_image(root)}
        async with EmulatorProcess(root / "emulator", key, images=images) as emu:
            server_env = agent_server_env(root)
            async with PaperclipServer(
                root / "paperclip", secrets=[key], extra_env=server_env
            ) as server:
                say(f"  server {server.api_base} up in {time.monotonic() - started:.1f} s")
                await server.cli("plugin", "install", str(REPO_ROOT), "--json")
                say("  plugin installed: paperclip.createos-sandbox-provider")
                async with httpx.AsyncClient(base_url=server.api_base, timeout=60) as client:
                    ok = await _heartbeat(server, emu, client, key)
            state = await emu.admin.state()
            left = [s["id"] for s in state["sandboxes"]]
            say(f"sandboxes left in the emulator: {left or 'none'}")
            ok = ok and not left and not server.leftover_pids
        ok = ok and not emu.leftover_pids
    except E2EError as exc:
        say(f"FAILED: {exc}")
        ok = False
    finally:
        if keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    say("PASS" if ok else "FAIL")
    return 0 if ok else 1


async def _heartbeat(
    server: PaperclipServer, emu: EmulatorProcess, client: httpx.AsyncClient, key: str
) -> bool:
    site = await AgentSite.create(server, client, "Demo Co")
    config = {"apiUrl": emu.base_url, "apiKey": key, "shape": "s-1vcpu-1gb", "rootfs": STUB_IMAGE}
    environment_id = await site.createos_environment("createos-emulator", config)
    agent_id = await site.agent("stub-agent", STUB_COMMAND, environment_id=environment_id)
    say(f"  agent {agent_id} (claude_local, CLI {STUB_COMMAND}) bound to the createos environment")
    seen = max([0, *(r["seq"] for r in await emu.admin.requests())])
    say("heartbeat: run log as the host writes it")
    run = await site.heartbeat(agent_id, on_log=print_log_entry)
    await site.wait_released(environment_id)
    requests = await emu.admin.requests(since=seen)
    created = [r for r in requests if r["method"] == "POST" and r["path"] == "/v1/sandboxes"]
    deleted = [r for r in requests if r["method"] == "DELETE" and r["path"].count("/") == 3]
    stub_file = site.workspace(agent_id) / STUB_FILE
    stub_text = stub_file.read_text().strip() if stub_file.exists() else "(missing)"
    say("summary")
    say(
        f"  status            {run.status}" + ("" if run.status == "succeeded" else f" {run.error}")
    )
    say(f"  wall time         {run.wall_s:.1f} s (invoke to final status)")
    say(f"  API requests      {len(requests)} (until the lease was released)")
    say(f"  sandboxes         {len(created)} created, {len(deleted)} deleted")
    say(f"  bridge call       GET /api/agents/me -> {', '.join(run.stub_values('bridge-status'))}")
    say(f"  workspace file    {STUB_FILE}: {stub_text}")
    say(f"  result            {json.dumps(run.record.get('resultJson', {}).get('result'))}")
    return (
        run.status == "succeeded"
        and run.stub_values("bridge-status") == ["200"]
        and stub_file.exists()
        and len(created) == len(deleted) == 1
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.demo_agent")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder")
    args = parser.parse_args(argv)
    try:
        return anyio.run(run, args.keep)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
