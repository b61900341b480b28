"""Python client of ``host/peer-driver.mjs``: drives the real Paperclip worker manager.

``HostPeer`` installs the peer (``host/install-peer.sh``, cached), runs the Node driver and
talks NDJSON to it::

    async with HostPeer() as peer:
        info = await peer.start_worker()
        assert await peer.call("health", {}) == {"status": "ok"}
        worker_pid = peer.worker_pid()          # the Python process behind the shim
        await peer.stop_worker()

Login terminals and duplex channels go through the manager's own routes (the ones the host's
login flow and gateway use); each is a handle id the driver keeps::

    channel = await peer.open_duplex_channel(target, ["cat"])
    await peer.write_duplex_channel(channel, b"ping")
    assert (await peer.read_duplex_channel(channel, min_bytes=4)).data == b"ping"
    await peer.close_session(channel)

Used by the conformance tests (tests/host), the benchmark and the demo.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec

from devtools.peer_sessions import (
    PeerCallError,
    PeerSessions,
)
from devtools.procfs import child_pids, cmdline

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
INSTALL_SCRIPT: Final = REPO_ROOT / "host" / "install-peer.sh"
DRIVER_SCRIPT: Final = REPO_ROOT / "host" / "peer-driver.mjs"
DEFAULT_PLUGIN_ID: Final = "createos-under-test"
READ_BYTES: Final = 1 << 20  # one read of the driver's pipe, and the pipe's size when allowed

LogCallback = Callable[[str, str], None]


class PeerUnavailable(RuntimeError):
    """Node/npm are missing or the peer could not be installed."""


def default_peer_dir() -> Path:
    """``$PAPERCLIP_PEER_CACHE`` or ``<repo>/.cache/paperclip/peer``."""
    configured = os.environ.get("PAPERCLIP_PEER_CACHE")
    return Path(configured) if configured else REPO_ROOT / ".cache" / "paperclip" / "peer"


async def ensure_peer_installed(peer_dir: Path | None = None) -> Path:
    """Install the worker-manager peer if needed (idempotent); returns its folder."""
    if shutil.which("node") is None:
        raise PeerUnavailable("node is not on PATH: the real-host peer needs Node 20+")
    target = peer_dir or default_peer_dir()
    env = {**os.environ, "PAPERCLIP_PEER_CACHE": str(target)}
    result = await anyio.run_process(
        ["bash", str(INSTALL_SCRIPT)], env=env, check=False, stderr=subprocess.PIPE
    )
    if result.returncode != 0:
        detail = result.stderr.decode("utf-8", "replace")[-2000:]
        raise PeerUnavailable(f"host/install-peer.sh failed ({result.returncode}):\n{detail}")
    lines = result.stdout.decode().strip().splitlines()
    return Path(lines[-1]) if lines else target


# --- the driver's stdout pipe ----------------------------------------------------------------

_decode_line = msgspec.json.Decoder().decode


def _enlarge_pipe(fd: int) -> None:
    """Grow the pipe to ``READ_BYTES`` (Linux; capped by fs.pipe-max-size), best effort."""
    # Not Linux, or above this machine's limit: the default size still works.
    with suppress(AttributeError, OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, READ_BYTES)


def _close_fd(fd: int) -> None:
    with suppress(OSError):
        os.close(fd)


# --- the peer --------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerInfo:
    """What ``start`` reported: the shim's pid, the worker's supportedMethods, start time."""

    plugin_id: str
    manifest_id: str
    entrypoint_path: str
    pid: int | None
    supported_methods: list[str]
    start_ms: float
    first_call_ms: float | None = None  # startWorker -> first_call answered, when asked for


@dataclass(frozen=True)
class WorkerEvent:
    """A worker lifecycle event from the manager (``exit``, ``crash`` or ``ready``)."""

    plugin_id: str
    type: str
    pid: int | None
    raw: dict[str, Any] = field(repr=False)


class HostPeer(PeerSessions):
    """The real worker manager behind ``node host/peer-driver.mjs`` (an async context manager)."""

    def __init__(
        self,
        *,
        package_root: Path = REPO_ROOT,
        peer_dir: Path | None = None,
        log_file: Path | None = None,
        plugin_id: str = DEFAULT_PLUGIN_ID,
        cwd: Path | None = None,
    ) -> None:
        self.package_root = package_root
        self.cwd = cwd
        self.peer_dir = peer_dir
        self.log_file = log_file
        self.plugin_id = plugin_id
        self.events: list[WorkerEvent] = []
        self._ids = itertools.count(1)
        self._pending: dict[int, anyio.Event] = {}
        self._answers: dict[int, dict[str, Any]] = {}
        self._log_callbacks: dict[int, LogCallback] = {}
        self._shim_pids: dict[str, int | None] = {}
        self._event_arrived = anyio.Event()
        self._ready = anyio.Event()
        self._closed = False
        self._stack: AsyncExitStack | None = None
        self._process: anyio.abc.Process | None = None

    async def __aenter__(self) -> Self:
        self.peer_dir = await ensure_peer_installed(self.peer_dir)
        log_file = self.log_file or self.peer_dir / "peer.log"
        read_fd, write_fd = os.pipe()  # the driver's stdout: our own pipe, enlarged
        async with AsyncExitStack() as stack:
            stack.callback(_close_fd, read_fd)
            try:
                _enlarge_pipe(read_fd)
                process = await anyio.open_process(
                    [
                        "node",
                        str(DRIVER_SCRIPT),
                        "--peer-dir",
                        str(self.peer_dir),
                        "--log-file",
                        str(log_file),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=write_fd,
                    stderr=None,
                    cwd=self.cwd,  # the host's cwd, inherited by the worker (it must not matter)
                )
            finally:
                os.close(write_fd)  # the driver holds the only write end: EOF when it exits
            self._process = process
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            # Runs first on exit: the driver stops its workers and exits, the reader sees EOF.
            stack.push_async_callback(self._close_process, process)
            tg.start_soon(self._read_loop, read_fd)
            with anyio.fail_after(60):
                await self._ready.wait()
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._stack is not None
        await self._stack.__aexit__(exc_type, exc, tb)

    async def _close_process(self, process: anyio.abc.Process) -> None:
        """Closing stdin makes the driver stop every worker and exit; kill it if it lingers."""
        with anyio.CancelScope(shield=True):
            if process.stdin is not None:
                await process.stdin.aclose()
            with anyio.move_on_after(20):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()

    async def _read_loop(self, fd: int) -> None:
        """Reads the driver's pipe up to 1 MiB at a time and routes each NDJSON line."""
        os.set_blocking(fd, False)
        parts: list[bytes] = []  # an unterminated line, joined once its newline arrives
        try:
            while True:
                try:
                    chunk = os.read(fd, READ_BYTES)
                except BlockingIOError:
                    await anyio.wait_readable(fd)
                    continue
                if not chunk:
                    break
                lines = chunk.split(b"\n")
                if len(lines) == 1:
                    parts.append(chunk)
                    continue
                if parts:
                    parts.append(lines[0])
                    lines[0] = b"".join(parts)
                    parts.clear()
                if lines[-1]:
                    parts.append(lines[-1])
                del lines[-1]
                for line in lines:
                    self._handle_line(line)
                await anyio.lowlevel.checkpoint()  # let callers run between large reads
            if parts:
                self._handle_line(b"".join(parts))
        finally:
            self._closed = True
            for request_id, event in list(self._pending.items()):
                self._answers.setdefault(
                    request_id,
                    {"ok": False, "error": {"code": None, "message": "peer driver exited"}},
                )
                event.set()
            self._event_arrived.set()

    def _handle_line(self, line: bytes) -> None:
        if not line or line.isspace():
            return
        try:
            message = _decode_line(line)
        except msgspec.DecodeError:
            print(f"host peer: non-JSON line {line[:200]!r}", file=sys.stderr)
            return
        if isinstance(message, dict):
            self._route(message)
        else:
            print(f"host peer: unexpected line {line[:200]!r}", file=sys.stderr)

    def _route(self, message: dict[str, Any]) -> None:
        request_id = message.get("id")
        kind = message.get("event")
        if kind == "ready":
            self._ready.set()
        elif kind == "log" and isinstance(request_id, int):
            callback = self._log_callbacks.get(request_id)
            if callback is not None:
                callback(str(message.get("stream")), str(message.get("chunk")))
        elif kind == "worker":
            raw_pid = message.get("pid")
            pid = raw_pid if isinstance(raw_pid, int) else None
            self.events.append(
                WorkerEvent(
                    plugin_id=str(message.get("pluginId")),
                    type=str(message.get("type")),
                    pid=pid,
                    raw=message,
                )
            )
            if message.get("type") == "ready":
                self._shim_pids[str(message.get("pluginId"))] = (
                    pid if isinstance(pid, int) else None
                )
            self._event_arrived.set()
            self._event_arrived = anyio.Event()
        elif isinstance(request_id, int) and request_id in self._pending:
            self._answers[request_id] = message
            self._pending.pop(request_id).set()
        else:
            print(f"host peer: unexpected line {message!r}", file=sys.stderr)

    async def command(
        self,
        op: str,
        payload: Mapping[str, Any] | None = None,
        *,
        timeout_s: float = 120.0,
        on_log: LogCallback | None = None,
    ) -> Any:
        """Send one driver command and return its result; raises ``PeerCallError``."""
        process = self._process
        if process is None or process.stdin is None or self._closed:
            raise PeerCallError(None, "the host peer is not running")
        request_id = next(self._ids)
        done = anyio.Event()
        self._pending[request_id] = done
        if on_log is not None:
            self._log_callbacks[request_id] = on_log
        message = {**(payload or {}), "id": request_id, "op": op}
        try:
            line = msgspec.json.encode(message) + b"\n"
        except UnicodeEncodeError:  # a lone surrogate, which a test sends on purpose:
            line = json.dumps(message).encode() + b"\n"  # as an escape, like Node writes it
        try:
            await process.stdin.send(line)
            with anyio.fail_after(timeout_s):
                await done.wait()
        finally:
            self._pending.pop(request_id, None)
            self._log_callbacks.pop(request_id, None)
        answer = self._answers.pop(request_id)
        if not answer.get("ok"):
            error = answer.get("error") or {}
            code = error.get("code")
            raise PeerCallError(code if isinstance(code, int) else None, str(error.get("message")))
        return answer.get("result")

    async def start_worker(
        self,
        plugin_id: str | None = None,
        *,
        package_root: Path | None = None,
        entrypoint_path: Path | None = None,
        manifest_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        auto_restart: bool = True,
        first_call: tuple[str, Mapping[str, Any]] | None = None,
    ) -> WorkerInfo:
        """``startWorker`` through the manager: spawn the shim, ``initialize``, wait for ready."""
        payload: dict[str, Any] = {
            "pluginId": plugin_id or self.plugin_id,
            "packageRoot": str(package_root or self.package_root),
            "autoRestart": auto_restart,
        }
        if entrypoint_path is not None:
            payload["entrypointPath"] = str(entrypoint_path)
        if manifest_path is not None:
            payload["manifestPath"] = str(manifest_path)
        if env is not None:
            payload["env"] = dict(env)
        if first_call is not None:
            payload["firstCall"] = {"method": first_call[0], "params": dict(first_call[1])}
        result = await self.command("start", payload, timeout_s=60)
        info = WorkerInfo(
            plugin_id=result["pluginId"],
            manifest_id=result["manifestId"],
            entrypoint_path=result["entrypointPath"],
            pid=result.get("pid"),
            supported_methods=list(result["supportedMethods"]),
            start_ms=float(result["startMs"]),
            first_call_ms=(
                float(result["firstCallMs"]) if result.get("firstCallMs") is not None else None
            ),
        )
        self._shim_pids[info.plugin_id] = info.pid
        return info

    async def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        timeout_ms: int = 30_000,
        on_log: LogCallback | None = None,
        plugin_id: str | None = None,
    ) -> Any:
        """``manager.call(...)``: the worker's result, or ``PeerCallError(code, message)``."""
        payload = {
            "pluginId": plugin_id or self.plugin_id,
            "method": method,
            "params": dict(params),
            "timeoutMs": timeout_ms,
        }
        return await self.command("call", payload, timeout_s=timeout_ms / 1000 + 30, on_log=on_log)

    async def stop_worker(self, plugin_id: str | None = None) -> None:
        """``stopWorker``: shutdown request, then the manager's SIGTERM/SIGKILL escalation."""
        await self.command("stop", {"pluginId": plugin_id or self.plugin_id}, timeout_s=30)

    async def status(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.command("status")
        return result

    async def worker_diagnostics(self, plugin_id: str | None = None) -> dict[str, Any] | None:
        """The manager's ``diagnostics()`` of one worker (status, shim pid, crash counts,
        pending requests), or None when no worker is registered."""
        result = await self.command("worker", {"pluginId": plugin_id or self.plugin_id})
        return result if isinstance(result, dict) else None

    def shim_pid(self, plugin_id: str | None = None) -> int | None:
        """Pid of the Node shim the manager forked (the latest start or restart)."""
        return self._shim_pids.get(plugin_id or self.plugin_id)

    def worker_pid(self, plugin_id: str | None = None) -> int | None:
        """Pid of the Python worker: the shim's child running ``-m provider``."""
        shim = self.shim_pid(plugin_id)
        if shim is None:
            return None
        children = child_pids(shim)
        for pid in children:
            if "provider" in cmdline(pid):
                return pid
        return children[0] if children else None

    async def wait_for_event(
        self, event_type: str, *, plugin_id: str | None = None, after: int = 0, timeout_s: float
    ) -> WorkerEvent:
        """The first ``event_type`` event at index >= ``after`` in :attr:`events`."""
        wanted = plugin_id or self.plugin_id
        with anyio.fail_after(timeout_s):
            while True:
                for event in self.events[after:]:
                    if event.type == event_type and event.plugin_id == wanted:
                        return event
                if self._closed:
                    raise PeerCallError(None, "peer driver exited")
                await self._event_arrived.wait()
