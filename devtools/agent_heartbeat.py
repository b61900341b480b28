"""Real agent heartbeats on the full Paperclip server (docs/protocol.md): set-up, invoke, poll, log.

Shared by the heartbeat e2e test, ``bench/heartbeat.py`` and ``make demo-agent``. The agent is a
``claude_local`` agent on the CLI engine whose command is a few lines of shell
(``tests/e2e/agent-image/opt/paperclip-stub/bin/claude``): it prints the stream-json lines the
adapter parses, appends a line to ``stub-heartbeats.txt`` in its working directory and calls
``GET /api/agents/me`` through the host's callback bridge. The emulator serves that folder as the
image :data:`STUB_IMAGE`, so inside a sandbox the CLI lives at :data:`STUB_COMMAND`; on the host's
local environment the same script runs from the checkout::

    async with PaperclipServer(root, extra_env=agent_server_env(root)) as server:
        site = await AgentSite.create(server, "Agent Co")
        env_id = await site.createos_environment({"apiUrl": ..., "apiKey": ..., ...})
        agent = await site.agent("stub", STUB_COMMAND, environment_id=env_id)
        run = await site.heartbeat(agent)
        assert run.status == "succeeded"
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import httpx

from devtools.e2e_server import REPO_ROOT, E2EError, PaperclipServer

STUB_IMAGE_DIR: Final = REPO_ROOT / "tests" / "e2e" / "agent-image"
STUB_IMAGE: Final = "paperclip-agent-stub:1"
STUB_COMMAND: Final = "/opt/paperclip-stub/bin/claude"
STUB_HOST_COMMAND: Final = str(STUB_IMAGE_DIR / STUB_COMMAND.lstrip("/"))
STUB_FILE: Final = "stub-heartbeats.txt"
FINAL_STATES: Final = frozenset({"succeeded", "failed", "timed_out", "cancelled", "interrupted"})
LOG_LIMIT_BYTES: Final = 4 << 20


def scratch_root(prefix: str) -> Path:
    """A fresh temp folder that the postgres user and the sandboxes' uid can traverse."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o711)  # traverse only: the postgres user and the sandbox uid need folders below
    return root


def stage_stub_image(root: Path) -> Path:
    """A copy of the stub image under ``root`` (a :func:`scratch_root`), for the emulator.

    The sandboxes' unprivileged uid must traverse every parent of an image folder, which a
    checkout under a private home (``/root/...``) does not allow; the scratch root does."""
    target = root / "agent-image"
    shutil.copytree(STUB_IMAGE_DIR, target, symlinks=True)
    for folder in [target, *(p for p in target.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)
    return target


def agent_server_env(root: Path) -> dict[str, str]:
    """What the server needs to run agents in sandboxes (docs/protocol.md A2): a JWT secret for the
    bridge's agent tokens and an empty Claude config folder (no real credentials are seeded)."""
    config_dir = root / "claude-config"
    config_dir.mkdir(parents=True, exist_ok=True)
    return {
        "PAPERCLIP_AGENT_JWT_SECRET": secrets.token_hex(32),
        "CLAUDE_CONFIG_DIR": str(config_dir),
    }


@dataclass
class HeartbeatRun:
    """One heartbeat, polled to its final status."""

    run_id: str
    status: str
    wall_s: float  # invoke to final status
    record: dict[str, Any]
    log: list[dict[str, Any]] = field(default_factory=list)
    live: list[bool] = field(default_factory=list)  # per log entry: read while still running

    def seen_while_running(self, needle: str) -> bool:
        """Whether a log entry holding ``needle`` was read before the run had ended."""
        return any(
            needle in e.get("chunk", "") and ok for e, ok in zip(self.log, self.live, strict=True)
        )

    @property
    def error(self) -> str:
        return f"{self.record.get('errorCode')}: {self.record.get('error')}"

    def stdout(self) -> str:
        return "".join(e.get("chunk", "") for e in self.log if e.get("stream") == "stdout")

    def stub_values(self, name: str) -> list[str]:
        """Values the stub printed as ``stub-<name>=<value>`` (one per heartbeat line)."""
        prefix = f"stub-{name}="
        found = []
        for line in self.stdout().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict) or event.get("type") != "assistant":
                continue
            for part in event.get("message", {}).get("content", []):
                text = part.get("text", "") if isinstance(part, dict) else ""
                if text.startswith(prefix):
                    found.append(text[len(prefix) :])
        return found


class AgentSite:
    """A company on a running server, with the environments and agents a scenario makes."""

    def __init__(self, server: PaperclipServer, client: httpx.AsyncClient, company_id: str):
        self.server = server
        self.client = client
        self.company_id = company_id

    @classmethod
    async def create(
        cls, server: PaperclipServer, client: httpx.AsyncClient, name: str
    ) -> AgentSite:
        company = _json(await client.post("/api/companies", json={"name": name}), 201)
        return cls(server, client, company["id"])

    async def createos_environment(self, name: str, config: Mapping[str, Any]) -> str:
        payload = {
            "name": name,
            "driver": "sandbox",
            "config": {"provider": "createos", **config},
        }
        answer = await self.client.post(
            f"/api/companies/{self.company_id}/environments", json=payload
        )
        environment = _json(answer, 201)
        return str(environment["id"])

    async def agent(
        self,
        name: str,
        command: str,
        *,
        environment_id: str | None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """A ``claude_local`` agent on the CLI engine running ``command`` (no model); ``env``
        goes into the CLI's environment (``PAPERCLIP_STUB_PAUSE=0``: the stub does not pause)."""
        adapter: dict[str, Any] = {"engine": "cli", "command": command, "timeoutSec": 300}
        if env:
            adapter["env"] = dict(env)
        payload: dict[str, Any] = {
            "name": name,
            "role": "general",
            "adapterType": "claude_local",
            "adapterConfig": adapter,
        }
        if environment_id is not None:
            payload["defaultEnvironmentId"] = environment_id
        answer = await self.client.post(f"/api/companies/{self.company_id}/agents", json=payload)
        return str((_json(answer, 201))["id"])

    def workspace(self, agent_id: str) -> Path:
        """The agent's host workspace (the fallback one: no project, no prior session)."""
        return self.server.data_dir / "instances" / "default" / "workspaces" / agent_id

    async def set_duplex_bridge(self, enabled: bool) -> None:
        """The instance's experimental ``enableSandboxDuplexBridge``: with it, and a provider
        that declares ``duplexCommandStream``, the agent's API calls travel over one duplex
        channel instead of a request folder polled through commands (docs/protocol.md A3.5)."""
        answer = await self.client.patch(
            "/api/instance/settings/experimental", json={"enableSandboxDuplexBridge": enabled}
        )
        _json(answer, 200)

    async def run_events(self, run_id: str) -> list[dict[str, Any]]:
        answer = await self.client.get(f"/api/heartbeat-runs/{run_id}/events")
        value = _json(answer, 200)
        assert isinstance(value, list)
        return value

    async def bridge_transport(self, run_id: str) -> dict[str, Any] | None:
        """The payload of the run's ``sandbox.duplex.transport`` event: ``transport`` is
        ``http2`` (a duplex channel) or ``file`` (with a ``fallback_reason``)."""
        for event in await self.run_events(run_id):
            if event.get("eventType") == "sandbox.duplex.transport":
                payload = event.get("payload")
                return payload if isinstance(payload, dict) else None
        return None

    async def leases(self, environment_id: str) -> list[dict[str, Any]]:
        answer = await self.client.get(f"/api/environments/{environment_id}/leases")
        value = _json(answer, 200)
        assert isinstance(value, list)
        return value

    async def wait_released(
        self, environment_id: str, count: int | None = None, timeout_s: float = 120.0
    ) -> list[dict[str, Any]]:
        """The environment's leases once every one is released (and ``count`` exist).

        The host releases a heartbeat's lease after it reported the run's status, so the
        next step of a scenario waits here for the receipt."""
        with anyio.fail_after(timeout_s):
            while True:
                leases = await self.leases(environment_id)
                settled = all(x["status"] == "released" for x in leases)
                if settled and (count is None or len(leases) == count):
                    return leases
                await anyio.sleep(0.2)

    async def heartbeat(
        self,
        agent_id: str,
        *,
        on_log: Callable[[dict[str, Any]], None] | None = None,
        timeout_s: float = 600.0,
    ) -> HeartbeatRun:
        """Invoke one heartbeat and poll it to a final status, following its log."""
        started = time.monotonic()
        answer = await self.client.post(f"/api/agents/{agent_id}/heartbeat/invoke", json={})
        run_id = str((_json(answer, 202))["id"])
        run = HeartbeatRun(run_id, "queued", 0.0, {})
        offset = 0
        with anyio.fail_after(timeout_s):
            while True:
                run.record = _json(await self.client.get(f"/api/heartbeat-runs/{run_id}"), 200)
                done = run.record.get("status") in FINAL_STATES
                run.wall_s = time.monotonic() - started
                offset = await self._follow_log(run, offset, not done, on_log)
                if done:
                    break
                await anyio.sleep(0.2)
        run.status = str(run.record.get("status"))
        return run

    async def _follow_log(
        self,
        run: HeartbeatRun,
        offset: int,
        running: bool,
        on_log: Callable[[dict[str, Any]], None] | None,
    ) -> int:
        params = {"offset": offset, "limitBytes": LOG_LIMIT_BYTES}
        answer = await self.client.get(f"/api/heartbeat-runs/{run.run_id}/log", params=params)
        if answer.status_code == 404:
            return offset  # no log file yet
        content = str((_json(answer, 200)).get("content") or "")
        complete, _, _ = content.rpartition("\n")
        if not complete:
            return offset
        for line in complete.split("\n"):
            entry = json.loads(line)
            run.log.append(entry)
            run.live.append(running)
            if on_log is not None:
                on_log(entry)
        return offset + len(complete.encode()) + 1


def _json(answer: httpx.Response, expected: int) -> Any:
    if answer.status_code != expected:
        raise E2EError(
            f"{answer.request.method} {answer.request.url.path} answered "
            f"{answer.status_code}: {answer.text[:500]}"
        )
    return answer.json()
