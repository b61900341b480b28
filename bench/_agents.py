"""The stage of the agent benches (``heartbeat.py``, ``concurrency.py``): one emulator serving the
stub agent's image, one full Paperclip server able to run agents in sandboxes, one company on it.

Everything is started in a fresh scratch folder and stopped (and the folder removed) on the way
out; the plugin install is left to each bench (``heartbeat.py`` installs a wrapped copy). Once the
server has stopped, :attr:`AgentStage.left` lists what the emulator still held (sandboxes, live
process trees, orphaned host processes) and what outlived the emulator itself: nothing should.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

from devtools.agent_heartbeat import (
    STUB_COMMAND,
    STUB_HOST_COMMAND,
    STUB_IMAGE,
    AgentSite,
    agent_server_env,
    scratch_root,
    stage_stub_image,
)
from devtools.e2e_server import PaperclipServer
from devtools.emulator_process import EmulatorProcess

NO_PAUSE: Final = {"PAPERCLIP_STUB_PAUSE": "0"}  # a no-op agent: the stub does not sleep


@dataclass
class AgentStage:
    root: Path
    key: str  # the emulator's API key (never printed)
    emu: EmulatorProcess
    server: PaperclipServer
    site: AgentSite
    left: list[str] = field(default_factory=list)  # filled in on a clean exit

    async def environment(self, name: str, **settings: Any) -> str:
        """A ``createos`` environment on the emulator running the stub image."""
        config = {"apiUrl": self.emu.base_url, "apiKey": self.key, "shape": "s-1vcpu-1gb"}
        return await self.site.createos_environment(
            name, {**config, "rootfs": STUB_IMAGE, **settings}
        )

    async def local_agent(self, name: str) -> str:
        """The stub agent on the host's local environment (the benches' baseline)."""
        return await self.site.agent(name, STUB_HOST_COMMAND, environment_id=None, env=NO_PAUSE)

    async def sandbox_agent(self, name: str, environment_id: str) -> str:
        return await self.site.agent(
            name, STUB_COMMAND, environment_id=environment_id, env=NO_PAUSE
        )


@asynccontextmanager
async def agent_stage(prefix: str, company: str) -> AsyncIterator[AgentStage]:
    root = scratch_root(prefix)
    key = f"bench-{secrets.token_hex(6)}"
    try:
        images = {STUB_IMAGE: stage_stub_image(root)}
        async with EmulatorProcess(root / "emulator", key, images=images) as emu:
            env = agent_server_env(root)
            async with (
                PaperclipServer(root / "paperclip", secrets=[key], extra_env=env) as server,
                httpx.AsyncClient(base_url=server.api_base, timeout=60) as client,
            ):
                site = await AgentSite.create(server, client, company)
                stage = AgentStage(root, key, emu, server, site)
                yield stage
            stage.left = await leftovers(emu)  # the server has stopped: nothing may remain
        stage.left += [f"host pid {pid} after the emulator stopped" for pid in emu.leftover_pids]
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def leftovers(emu: EmulatorProcess) -> list[str]:
    """What the emulator still holds: sandboxes, live process trees, orphaned host processes."""
    state = await emu.admin.state()
    left = [f"sandbox {s['id']} ({s['status']})" for s in state["sandboxes"]]
    left += [f"process {p['process_id']}" for p in state["processes"] if p["tree_alive"]]
    left += [f"host pid {pid}" for pid in state["orphan_host_pids"]]
    return left
