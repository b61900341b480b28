"""Shared pieces of the benchmarks: the emulator as a subprocess, a Python host stand-in that
speaks the worker protocol over pipes, /proc figures of a process, and config helpers.

Not a test helper: nothing here asserts; the scripts print what they measure.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc

from provider.devtools.host_peer import REPO_ROOT
from provider.emulator import EmulatorAdmin
from provider.rpc.stdio import FdReceiveStream, FdSendStream, LineReader

PYTHON: Final = str(REPO_ROOT / ".venv" / "bin" / "python")
API_KEY: Final = "bench-key"
SHAPE: Final = "s-1vcpu-1gb"
RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
MIB: Final = 1024 * 1024
GIB: Final = 1024 * MIB
_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


# --- /proc figures --------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (its own threads, not its children), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # fields 14 and 15 of stat


def descendants_cpu_seconds(root: int) -> float:
    """CPU time of every live descendant of ``root`` plus the children each one has reaped
    (utime, stime, cutime, cstime): for the emulator, its sandboxes' processes."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(value) for value in fields[11:15]) / _CLOCK_TICKS
    total = 0.0
    for pid in times:
        ancestor = parents.get(pid, 0)
        while ancestor > 1 and ancestor != root:
            ancestor = parents.get(ancestor, 0)
        if ancestor == root:
            total += times[pid]
    return total


def parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def status_kib(pid: int, key: str) -> int:
    """A ``kB`` line of /proc/<pid>/status (``VmHWM``, ``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def peak_rss_mib(pid: int) -> float:
    return status_kib(pid, "VmHWM") / 1024


def save_result(name: str, result: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


# --- the emulator in its own process --------------------------------------------------------


@dataclass(frozen=True)
class RunningEmulator:
    base_url: str
    admin: EmulatorAdmin
    pid: int


@asynccontextmanager
async def emulator_process() -> AsyncIterator[RunningEmulator]:
    """``python -m provider.emulator`` on an ephemeral port, stopped with SIGTERM afterwards."""
    token = secrets.token_urlsafe(16)
    process = await anyio.open_process(
        [
            PYTHON,
            "-m",
            "provider.emulator",
            "--quiet",
            "--api-key",
            API_KEY,
            "--admin-token",
            token,
        ],
        stdout=subprocess.PIPE,
        stderr=None,
        cwd=REPO_ROOT,
    )
    try:
        assert process.stdout is not None
        with anyio.fail_after(30):
            base_url = (await LineReader(process.stdout).receive_line()).decode().strip()
        yield RunningEmulator(base_url, EmulatorAdmin(base_url, token), process.pid)
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(30):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()


def environment_call(base_url: str, *, timeout_ms: int = 600_000) -> dict[str, Any]:
    """The common params of every driver call against ``base_url``."""
    return {
        "driverKey": "createos",
        "companyId": "bench-company",
        "environmentId": "bench-env",
        "config": {
            "apiUrl": base_url,
            "apiKey": API_KEY,
            "shape": SHAPE,
            "timeoutMs": timeout_ms,
            "reuseLease": False,
        },
    }


def with_lease(common: dict[str, Any], lease: dict[str, Any]) -> dict[str, Any]:
    return {**common, "lease": {**lease, "expiresAt": None}}


def lease_ref(common: dict[str, Any], lease: dict[str, Any]) -> dict[str, Any]:
    return {
        **common,
        "providerLeaseId": lease["providerLeaseId"],
        "leaseMetadata": lease["metadata"],
    }


# --- a Python host stand-in ------------------------------------------------------------------

LogSink = Callable[[str, str], None]


class WorkerCallError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"[{error.get('code')}] {error.get('message')}")
        self.error = error


class _BigReads(anyio.abc.ByteReceiveStream):
    """Reads the worker's stdout pipe in 1 MiB gulps (what a host with a big buffer does)."""

    def __init__(self, fd: int) -> None:
        self._inner = FdReceiveStream(fd)

    async def receive(self, max_bytes: int = MIB) -> bytes:
        return await self._inner.receive(max(max_bytes, MIB))

    async def aclose(self) -> None:
        await self._inner.aclose()


class StdioWorker:
    """``python -m provider`` on pipes, driven the way the host drives it.

    Every line the worker writes is parsed (``json.loads``); ``execute.log`` notifications are
    routed to the sink of the call whose invocation id they carry. The environment is scrubbed
    like the host's (PATH and the deployment variables only), so the worker paces its requests
    with the real 300 ms. The pipes are read and written without blocking, like the worker's own.
    """

    def __init__(self, argv: list[str] | None = None) -> None:
        self._argv = argv or [PYTHON, "-m", "provider"]
        self._ids = itertools.count(1)
        self._waiting: dict[int, anyio.Event] = {}
        self._answers: dict[int, dict[str, Any]] = {}
        self._sinks: dict[str, LogSink] = {}
        self._stack: AsyncExitStack | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._send: FdSendStream | None = None
        self._send_lock = anyio.Lock()
        self.lines_parsed = 0
        self.host_logs: list[dict[str, Any]] = []

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    async def __aenter__(self) -> StdioWorker:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PAPERCLIP_DEPLOYMENT_MODE": "local_trusted",
            "PAPERCLIP_DEPLOYMENT_EXPOSURE": "private",
            "PYTHONUNBUFFERED": "1",
            "PYTHONUTF8": "1",
        }
        async with AsyncExitStack() as stack:
            process = subprocess.Popen(
                self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO_ROOT, env=env
            )
            self._process = process
            assert process.stdin is not None and process.stdout is not None
            self._send = FdSendStream(process.stdin.fileno())
            receive = _BigReads(process.stdout.fileno())
            stack.push_async_callback(self._close, process, receive)
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            tg.start_soon(self._read_loop, receive)
            init = {
                "manifest": json.loads((REPO_ROOT / "manifest.json").read_text()),
                "config": {},
                "apiVersion": 1,
                "databaseNamespace": None,
                "instanceInfo": {"instanceId": "bench", "hostVersion": "0.0.0"},
            }
            await self.call("initialize", init)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._stack is not None
        await self._stack.aclose()

    async def _close(self, process: subprocess.Popen[bytes], receive: _BigReads) -> None:
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(15):
                if process.poll() is None:
                    await self.call("shutdown", {})
            assert self._send is not None and process.stdin is not None
            await self._send.aclose()
            process.stdin.close()
            with anyio.move_on_after(15):
                await anyio.to_thread.run_sync(process.wait)
            if process.poll() is None:
                process.kill()
                await anyio.to_thread.run_sync(process.wait)
            await receive.aclose()
            if process.stdout is not None:
                process.stdout.close()

    async def _read_loop(self, receive: _BigReads) -> None:
        reader = LineReader(receive)
        try:
            while True:
                try:
                    line = await reader.receive_line()
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    break
                message = json.loads(line)
                self.lines_parsed += 1
                self._route(message)
        finally:
            for request_id, event in list(self._waiting.items()):
                self._answers.setdefault(
                    request_id, {"error": {"code": None, "message": "worker exited"}}
                )
                event.set()

    def _route(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method == "execute.log":
            sink = self._sinks.get(str(message.get("paperclipInvocationId")))
            params = message["params"]
            if sink is not None:
                sink(params["stream"], params["chunk"])
        elif method == "log":
            self.host_logs.append(message["params"])
        elif method is None:
            request_id = message.get("id")
            if isinstance(request_id, int) and request_id in self._waiting:
                self._answers[request_id] = message
                self._waiting.pop(request_id).set()
        else:
            print(f"stand-in host: unexpected {method!r} from the worker", file=sys.stderr)

    async def call(
        self, method: str, params: dict[str, Any], *, on_log: LogSink | None = None
    ) -> Any:
        assert self._send is not None
        request_id = next(self._ids)
        message: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": method,
            "params": params,
        }
        invocation = f"inv-{request_id}"
        if "companyId" in params:
            message["paperclipInvocation"] = {
                "id": invocation,
                "scope": {"companyId": params["companyId"]},
            }
        if on_log is not None:
            self._sinks[invocation] = on_log
        done = anyio.Event()
        self._waiting[request_id] = done
        try:
            async with self._send_lock:
                await self._send.send(json.dumps(message).encode() + b"\n")
            await done.wait()
        finally:
            self._waiting.pop(request_id, None)
            self._sinks.pop(invocation, None)
        answer = self._answers.pop(request_id)
        if "error" in answer:
            raise WorkerCallError(answer["error"])
        return answer.get("result")
