"""One scenario on the real Paperclip server with the emulator serving the agent stub image:
both started in a scratch folder under a budget, every leak check after they stop."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Awaitable, Callable

import anyio

from devtools.agent_heartbeat import STUB_IMAGE, agent_server_env, scratch_root, stage_stub_image
from devtools.e2e_server import PaperclipServer
from devtools.emulator_process import EmulatorProcess
from tests.e2e.inspection import assert_emulator_empty, cmdline_mentions

Scenario = Callable[[PaperclipServer, EmulatorProcess, str], Awaitable[None]]


async def run_on_stub_server(prefix: str, what: str, budget_s: float, scenario: Scenario) -> str:
    """Run ``scenario(server, emulator, api_key)`` within ``budget_s``; then nothing of ``what``
    may be left (server processes, emulator sandboxes and processes, the scratch folder in a
    command line) and the server log must not hold the key. Returns the unredacted log."""
    root = scratch_root(prefix)
    api_key = f"emu-key-{secrets.token_hex(8)}"
    try:
        with anyio.fail_after(budget_s):
            images = {STUB_IMAGE: stage_stub_image(root)}
            async with EmulatorProcess(root / "emulator", api_key, images=images) as emu:
                async with PaperclipServer(
                    root / "paperclip", secrets=[api_key], extra_env=agent_server_env(root)
                ) as server:
                    await scenario(server, emu, api_key)
                server_log = server.raw_log_text()  # unredacted: the key check must be able to fail
                assert server.leftover_pids == [], "processes outlived the server's SIGTERM"
                await assert_emulator_empty(emu, what)
            assert emu.leftover_pids == []
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert cmdline_mentions(str(root)) == [], "a process still refers to the test's folder"
    assert api_key not in server_log
    return server_log
