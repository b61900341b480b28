"""One way to talk to a running worker, whichever host runs it.

``open_worker_host`` starts our worker under the real Paperclip worker manager (Node, via
:class:`~devtools.host_peer.HostPeer`) or, when Node/npm are missing or asked for,
under the small Python host of :mod:`devtools.stdio_host`. Both give a
:class:`WorkerHost`: ``call(method, params, timeout_ms=..., on_log=...)`` plus what the start-up
reported. Used by the demo and the live smoke tests.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import anyio

from devtools.host_peer import HostPeer, PeerUnavailable
from devtools.procfs import pid_alive, wait_until_gone
from devtools.stdio_host import LogCallback, NotificationCallback, StdioHost

HostChoice = Literal["auto", "node", "python"]
HOST_CHOICES: tuple[HostChoice, ...] = ("auto", "node", "python")
STOP_BUDGET_S: Final = 60.0


class WorkerHost(Protocol):
    """What callers need from a host running our worker."""

    @property
    def name(self) -> str: ...

    @property
    def supported_methods(self) -> list[str]: ...

    @property
    def start_ms(self) -> float: ...

    @property
    def worker_pids(self) -> list[int]: ...

    async def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        timeout_ms: int = 30_000,
        on_log: LogCallback | None = None,
    ) -> Any: ...


@dataclass
class HostReport:
    """Filled when the host stops: which of the worker's processes outlived the stop."""

    processes_left: list[int] = field(default_factory=list)


@dataclass
class _ManagerHost:
    peer: HostPeer
    supported_methods: list[str]
    start_ms: float
    worker_pids: list[int]
    name: str = "the real Paperclip worker manager (@paperclipai/server 2026.916.1, Node)"

    async def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        timeout_ms: int = 30_000,
        on_log: LogCallback | None = None,
    ) -> Any:
        return await self.peer.call(method, params, timeout_ms=timeout_ms, on_log=on_log)


@dataclass
class _PythonHost:
    host: StdioHost
    name: str = "the Python stdio host (devtools/stdio_host.py; Node not used)"

    @property
    def supported_methods(self) -> list[str]:
        return self.host.supported_methods

    @property
    def start_ms(self) -> float:
        return self.host.start_ms

    @property
    def worker_pids(self) -> list[int]:
        pid = self.host.worker_pid
        return [pid] if pid is not None else []

    async def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        timeout_ms: int = 30_000,
        on_log: LogCallback | None = None,
    ) -> Any:
        return await self.host.call(method, params, timeout_ms=timeout_ms, on_log=on_log)


def node_available() -> bool:
    return shutil.which("node") is not None and shutil.which("npm") is not None


@asynccontextmanager
async def open_worker_host(
    choice: HostChoice,
    *,
    log_dir: Path,
    report: HostReport | None = None,
    notice: Callable[[str], None] = lambda _text: None,
    worker_env: Mapping[str, str] | None = None,
    on_notification: NotificationCallback | None = None,
) -> AsyncIterator[WorkerHost]:
    """A started worker under the chosen host; stopped (and checked for leftovers) on exit.

    ``auto`` uses the real worker manager when Node and npm are present and the peer installs,
    else the Python host (``notice`` says why). ``worker_env`` only reaches the Python host's
    worker: the real manager scrubs the environment it passes on. ``on_notification`` (the
    worker's ``duplexChannel.*`` and ``loginPty.*`` notifications) needs the Python host: the
    Node peer relays calls and ``execute.log`` only, not the manager's route sessions.
    """
    if on_notification is not None and choice != "python":
        raise ValueError("on_notification needs the Python host (choice='python')")
    report = report if report is not None else HostReport()
    if choice != "python" and not node_available():
        if choice == "node":
            raise PeerUnavailable("node and npm are needed for the real worker manager")
        notice("node/npm not found: using the Python stdio host instead of the worker manager")
        choice = "python"
    pids: list[int] = []
    try:
        async with AsyncExitStack() as stack:
            host: WorkerHost
            if choice != "python":
                peer = HostPeer(log_file=log_dir / "worker-manager.log", cwd=log_dir)
                try:
                    await stack.enter_async_context(peer)
                except PeerUnavailable as exc:
                    if choice == "node":
                        raise
                    notice(f"the worker manager is unavailable ({exc}); using the Python host")
                    choice = "python"
                else:
                    info = await peer.start_worker(auto_restart=False)
                    pids = [pid for pid in (peer.shim_pid(), peer.worker_pid()) if pid is not None]
                    stack.push_async_callback(_stop_worker, peer)
                    host = _ManagerHost(peer, info.supported_methods, info.start_ms, pids)
            if choice == "python":
                stdio = StdioHost(
                    env=worker_env,
                    stderr=log_dir / "worker-stderr.log",
                    on_notification=on_notification,
                )
                await stack.enter_async_context(stdio)
                host = _PythonHost(stdio)
                pids = host.worker_pids
            yield host
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_BUDGET_S):
            for pid in pids:
                await wait_until_gone(pid, 15)
        report.processes_left = [pid for pid in pids if pid_alive(pid)]


async def _stop_worker(peer: HostPeer) -> None:
    """``stopWorker`` (shutdown, then the manager's escalation), even when cancelled."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_BUDGET_S):
        await peer.stop_worker()
