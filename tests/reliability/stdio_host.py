"""A host stand-in speaking the worker protocol to a real ``python -m provider`` over pipes.

It keeps every byte the worker writes (stdout and stderr, raw), routes answers to concurrent
callers and ``execute.log`` notifications to the call whose invocation id they carry, and keeps
``log`` notifications. The environment is scrubbed the way the host does it (``PATH`` and the
deployment variables), plus whatever the caller adds (e.g. ``XDG_STATE_HOME``).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

from provider.devtools.host_peer import REPO_ROOT

PYTHON = str(REPO_ROOT / ".venv" / "bin" / "python")
LogSink = Callable[[str, str], None]


class WorkerCallError(Exception):
    """The worker answered a call with a JSON-RPC error."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"[{error.get('code')}] {error.get('message')}")
        self.error = error


class StdioHost:
    """``async with StdioHost(env={...}) as host: await host.call(method, params)``."""

    def __init__(self, *, env: Mapping[str, str] | None = None) -> None:
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PAPERCLIP_DEPLOYMENT_MODE": "local_trusted",
            "PAPERCLIP_DEPLOYMENT_EXPOSURE": "private",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.messages: list[dict[str, Any]] = []
        self.host_logs: list[dict[str, Any]] = []
        self.returncode: int | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, anyio.Event] = {}
        self._answers: dict[int, dict[str, Any]] = {}
        self._sinks: dict[str, LogSink] = {}
        self._send_lock = anyio.Lock()
        self._process: anyio.abc.Process | None = None
        self._stack: AsyncExitStack | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    async def __aenter__(self) -> Self:
        async with AsyncExitStack() as stack:
            process = await anyio.open_process(
                [PYTHON, "-m", "provider"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=REPO_ROOT,
                env=self.env,
            )
            self._process = process
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.push_async_callback(self._close, process)
            tg.start_soon(self._read_stdout, process)
            tg.start_soon(self._read_stderr, process)
            init = {
                "manifest": json.loads((REPO_ROOT / "manifest.json").read_text()),
                "config": {},
                "apiVersion": 1,
                "databaseNamespace": None,
                "instanceInfo": {"instanceId": "reliability", "hostVersion": "0.0.0"},
            }
            with anyio.fail_after(15):
                await self.call("initialize", init)
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

    async def _close(self, process: anyio.abc.Process) -> None:
        """``shutdown``, close stdin, wait for the exit (killing a worker that lingers)."""
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(20):
                if process.returncode is None:
                    await self.call("shutdown", {})
            assert process.stdin is not None
            await process.stdin.aclose()
            with anyio.move_on_after(20):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            self.returncode = process.returncode
            # The readers end at EOF, which the exit brings.

    async def _read_stderr(self, process: anyio.abc.Process) -> None:
        assert process.stderr is not None
        async for chunk in process.stderr:
            self.stderr += chunk

    async def _read_stdout(self, process: anyio.abc.Process) -> None:
        assert process.stdout is not None
        pending = b""
        try:
            async for chunk in process.stdout:
                self.stdout += chunk
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._route(json.loads(line))
        finally:
            for request_id, event in list(self._waiting.items()):
                self._answers.setdefault(
                    request_id, {"error": {"code": None, "message": "worker exited"}}
                )
                event.set()

    def _route(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        method = message.get("method")
        if method == "execute.log":
            sink = self._sinks.get(str(message.get("paperclipInvocationId")))
            if sink is not None:
                sink(message["params"]["stream"], message["params"]["chunk"])
        elif method == "log":
            self.host_logs.append(message)
        elif method is None:
            request_id = message.get("id")
            if isinstance(request_id, int) and request_id in self._waiting:
                self._answers[request_id] = message
                self._waiting.pop(request_id).set()

    async def call(
        self, method: str, params: dict[str, Any], *, on_log: LogSink | None = None
    ) -> Any:
        """One request; the result, or :class:`WorkerCallError` with the worker's error."""
        process = self._process
        assert process is not None and process.stdin is not None
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        message["params"] = params
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
                await process.stdin.send(json.dumps(message).encode() + b"\n")
            await done.wait()
        finally:
            self._waiting.pop(request_id, None)
            self._sinks.pop(invocation, None)
        answer = self._answers.pop(request_id)
        if "error" in answer:
            raise WorkerCallError(answer["error"])
        return answer.get("result")


def environment_call(base_url: str, api_key: str, **config: Any) -> dict[str, Any]:
    """The common params of a driver call against ``base_url`` with ``api_key``."""
    return {
        "driverKey": "createos",
        "companyId": "company-rel",
        "environmentId": "env-rel",
        "config": {
            "apiUrl": base_url,
            "apiKey": api_key,
            "shape": "s-1vcpu-1gb",
            "timeoutMs": 120_000,
            "reuseLease": False,
            **config,
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


def state_files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (the worker's state folder: the journal and its WAL)."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
