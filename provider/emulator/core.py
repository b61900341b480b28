"""The emulator's shared state: keys, sandboxes, process index, request log, faults, rate limit."""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from .bwrap import GuestRuntime
from .guest import Guest
from .ids import key_hash
from .images import ImageCatalog
from .processes import ManagedProcess
from .sandbox_guest import guarded
from .sandbox_spec import SandboxSpec, egress_restricts
from .sandboxes import Sandbox
from .settings import Settings
from .usernet import choose_mode

log = logging.getLogger("provider.emulator")


@dataclass
class Fault:
    """A scripted answer for the next ``times`` requests matching method and path regex."""

    method: str
    path_regex: str
    times: int = 1
    status: int | None = None
    body: dict[str, Any] | None = None
    retry_after: str | None = None
    delay_ms: int | None = None
    drop: bool = False
    lose_response: bool = False
    stream_lines: list[str] | None = None
    cut_after_frames: int | None = None
    cut_after_bytes: int | None = None
    pattern: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        self.pattern = re.compile(self.path_regex)

    def matches(self, method: str, path: str) -> bool:
        return (self.method == "*" or self.method.upper() == method) and bool(
            self.pattern.search(path)
        )


class EmulatorCore:
    """Everything the route handlers share. Lives inside the server's task group."""

    def __init__(
        self,
        *,
        api_keys: list[str],
        data_dir: Path,
        runtime: GuestRuntime,
        supervisor: Path,
        settings: dict[str, Any] | None,
        unshare_net: bool,
        images: ImageCatalog | None = None,
    ) -> None:
        self.keys = {key: key_hash(key) for key in api_keys}
        self.data_dir = data_dir
        self.runtime = runtime
        self.supervisor = supervisor
        self.unshare_net = unshare_net
        self.images = images if images is not None else ImageCatalog()
        self.settings = Settings()
        self._initial_settings = dict(settings or {})
        errors = self.settings.update(self._initial_settings)
        if errors:
            raise ValueError(f"invalid emulator settings: {sorted(errors)}")
        self.sandboxes: dict[str, Sandbox] = {}
        self.processes: dict[str, tuple[Sandbox, ManagedProcess]] = {}
        self.faults: list[Fault] = []
        self.log: list[dict[str, Any]] = []
        self.log_seq = 0
        # Every managed process started, kept after its sandbox is gone (benchmarks classify
        # the commands a client ran): bounded like the request log.
        self.process_history: list[dict[str, Any]] = []
        self.exec_history: list[dict[str, Any]] = []  # every exec spawned, the same way
        self.self_history: list[dict[str, Any]] = []  # guest agent requests (the last 1,000)
        self.rate: dict[str, deque[float]] = {}
        self.guests: list[Guest] = []  # every guest we started (leak checks)
        self.tg: anyio.abc.TaskGroup | None = None

    # -- request log, faults, rate limit ------------------------------------------------
    def record(self, method: str, path: str, query: str, auth: str, status: int) -> None:
        self.log_seq += 1
        self.log.append(
            {
                "seq": self.log_seq,
                "method": method,
                "path": path,
                "query": query,
                "auth": auth,
                "status": status,
                "time": time.time(),
            }
        )
        if len(self.log) > 100_000:
            del self.log[:10_000]

    def take_fault(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.times > 0 and fault.matches(method, path):
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.remove(fault)
                return fault
        return None

    def rate_limited(self, client: str) -> int | None:
        """Seconds to wait when ``client`` is over the limit (and the limit is on), else None."""
        if not self.settings.rate_limit:
            return None
        now = time.monotonic()
        window = self.rate.setdefault(client, deque())
        while window and window[0] <= now - 60:
            window.popleft()
        if len(window) >= self.settings.rate_limit_per_minute:
            return max(1, int(window[0] + 60 - now + 0.999))
        window.append(now)
        return None

    # -- sandboxes ----------------------------------------------------------------------
    def owned(self, owner: str) -> list[Sandbox]:
        return [sb for sb in self.sandboxes.values() if sb.owner == owner]

    def find(self, owner: str, sandbox_id: str) -> Sandbox | None:
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None or sandbox.owner != owner:
            return None
        return sandbox

    def new_sandbox(self, spec: SandboxSpec, owner: str, forked_from: str | None = None) -> Sandbox:
        """A new row; its network mode follows ``spec.egress`` now (or ``--unshare-net``)."""
        sandbox = Sandbox(
            spec,
            owner=owner,
            state_root=self.data_dir / "sandboxes",
            runtime=self.runtime,
            settings=self.settings,
            forked_from=forked_from,
            network=choose_mode(restricted=self.unshare_net or egress_restricts(spec.egress)),
        )
        sandbox.on_self = functools.partial(self._self_request, sandbox)
        self.sandboxes[sandbox.id] = sandbox
        return sandbox

    def _self_request(self, sandbox: Sandbox, action: str, reason: str) -> None:
        """The guest agent of ``sandbox`` was asked to delete or pause it (it answered 202
        already): performed here as the API's DELETE or POST /pause would."""
        if action not in ("delete", "pause"):  # the guest's word: never trusted
            return
        log.info("sandbox %s asked for self-%s (reason %r)", sandbox.id, action, reason[:200])
        self.self_history.append(
            {"sandbox_id": sandbox.id, "action": action, "reason": reason, "time": time.time()}
        )
        del self.self_history[:-1000]
        if action == "delete":
            self.start_soon(lambda: self.delete(sandbox))
        elif action == "pause" and sandbox.can_pause:
            self.start_soon(sandbox.pause)

    async def boot(self, sandbox: Sandbox) -> None:
        """Start the sandbox's guest inside the core task group; raises when it cannot start."""
        assert self.tg is not None
        await self.tg.start(self._run_sandbox, sandbox)
        if sandbox.guest is not None:
            self.guests.append(sandbox.guest)

    async def _run_sandbox(
        self, sandbox: Sandbox, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        try:
            await sandbox.run(supervisor=self.supervisor, task_status=task_status)
        finally:
            with anyio.CancelScope(shield=True):
                await sandbox.kill_guest()

    async def delete(self, sandbox: Sandbox) -> str:
        """A delete request (API or guest agent): the status it answers."""
        if sandbox.status in ("destroyed", "destroying"):
            return sandbox.status
        return await self.destroy(sandbox)

    async def destroy(self, sandbox: Sandbox) -> str:
        """Kill the guest now; state dir removal and the ``destroyed`` flip follow."""
        answered = sandbox.begin_destroy()
        await sandbox.kill_guest()
        for process in sandbox.processes.values():
            self.processes.pop(process.process_id, None)
        self.start_soon(lambda: self._reclaim(sandbox))
        return answered

    async def _reclaim(self, sandbox: Sandbox) -> None:
        await sandbox.files.wait_free()  # a fork copying from or into it finishes first
        with contextlib.suppress(OSError):
            await anyio.to_thread.run_sync(sandbox.files.remove)
        await anyio.sleep(self.settings.delete_delay_ms / 1000)
        sandbox.finish_destroy()
        await anyio.sleep(self.settings.destroyed_retention_ms / 1000)
        if self.sandboxes.get(sandbox.id) is sandbox and sandbox.status == "destroyed":
            del self.sandboxes[sandbox.id]

    def settings_changed(self) -> None:
        """After an admin settings change: idle timers recompute (the time scale may differ)."""
        for sandbox in self.sandboxes.values():
            sandbox.rearm()

    def start_soon(self, func: Callable[[], Awaitable[Any]]) -> None:
        """Run ``func`` in the emulator's task group, errors logged (see ``guarded``)."""
        if self.tg is not None:
            self.tg.start_soon(guarded, func)

    def namespaces(self) -> dict[str, float | None]:
        """pid namespace -> boot ticks when emptied (None while live), for ``scan_host``."""
        return {g.pid_ns: g.ended_at for g in self.guests if g.pid_ns is not None}

    def register_process(self, sandbox: Sandbox, process: ManagedProcess) -> None:
        self.processes[process.process_id] = (sandbox, process)
        self.process_history.append(
            {
                "sandbox_id": sandbox.id,
                "process_id": process.process_id,
                "cmd": process.cmd,
                "args": list(process.args),
                "cwd": process.cwd,
                "time": time.time(),
            }
        )
        if len(self.process_history) > 20_000:
            del self.process_history[:2_000]

    def record_exec(
        self, sandbox: Sandbox, cmd: str, args: list[str], *, streamed: bool
    ) -> dict[str, Any]:
        """Log a spawned exec; the caller sets its ``exited`` time when the leader exits."""
        entry: dict[str, Any] = {
            "sandbox_id": sandbox.id,
            "cmd": cmd,
            "args": list(args),
            "streamed": streamed,
            "time": time.time(),
            "exited": None,
        }
        self.exec_history.append(entry)
        if len(self.exec_history) > 20_000:
            del self.exec_history[:2_000]
        return entry

    async def shutdown(self) -> None:
        """Kill every guest and remove every state dir (used by reset and on exit)."""
        with anyio.CancelScope(shield=True):
            sandboxes = list(self.sandboxes.values())
            for sandbox in sandboxes:
                await sandbox.kill_guest()
            for sandbox in sandboxes:
                await sandbox.files.wait_free()
                with contextlib.suppress(OSError):
                    await anyio.to_thread.run_sync(sandbox.files.remove)
            self.sandboxes.clear()
            self.processes.clear()

    async def reset(self) -> None:
        await self.shutdown()
        self.faults.clear()
        self.log.clear()
        self.process_history.clear()
        self.exec_history.clear()
        self.self_history.clear()
        self.rate.clear()
        fresh = Settings()
        fresh.update(self._initial_settings)
        vars(self.settings).update(vars(fresh))
