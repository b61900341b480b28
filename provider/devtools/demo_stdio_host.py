"""A small Python host that speaks the Paperclip stdio protocol to ``python -m provider``.

The fallback for machines without Node: it does what the worker manager does for our verbs
(host-protocol.md 1-5) and nothing more. It spawns the worker with the host's scrubbed
environment, sends ``initialize``, adds a ``paperclipInvocation`` to every call that carries a
``companyId``, routes ``execute.log`` notifications by the invocation id the worker echoes,
answers ``config.get`` with ``{}``, and stops the worker with ``shutdown`` then end of input::

    async with StdioHost() as host:
        result = await host.call("environmentExecute", params, on_log=print_chunk)

Failures raise :class:`~provider.devtools.host_peer.PeerCallError`, like the real peer.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Self

import anyio
import anyio.abc

from provider.devtools.host_peer import REPO_ROOT, PeerCallError
from provider.rpc.stdio import LineReader

LogCallback = Callable[[str, str], None]
INITIALIZE_TIMEOUT_S: Final = 15.0
SHUTDOWN_WAIT_S: Final = 10.0
EXIT_WAIT_S: Final = 5.0
METHOD_NOT_FOUND: Final = -32601


def host_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the 916.1 worker manager passes (host-protocol.md 1), plus what the shim adds."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "NODE_ENV": "production",
        "TZ": os.environ.get("TZ", "UTC"),
        "PAPERCLIP_PLUGIN_ID": "createos-stdio-host",
        "PAPERCLIP_DEPLOYMENT_MODE": "local_trusted",
        "PAPERCLIP_DEPLOYMENT_EXPOSURE": "private",
        "PYTHONUNBUFFERED": "1",
        "PYTHONUTF8": "1",
    }
    env.update(extra or {})
    return env


class StdioHost:
    """``python -m provider`` in a child process, driven over NDJSON JSON-RPC on its stdio."""

    def __init__(
        self,
        *,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        stderr_path: Path | None = None,
    ) -> None:
        self.python = python
        self.extra_env = dict(env or {})
        self.stderr_path = stderr_path
        self.supported_methods: list[str] = []
        self.start_ms = 0.0
        self.exit_code: int | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, anyio.Event] = {}
        self._answers: dict[int, dict[str, Any]] = {}
        self._sinks: dict[str, LogCallback] = {}
        self._process: anyio.abc.Process | None = None
        self._stack: AsyncExitStack | None = None
        self._stderr: IO[bytes] | None = None
        self._closed = False
        self._write_lock = anyio.Lock()

    @property
    def worker_pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def __aenter__(self) -> Self:
        async with AsyncExitStack() as stack:
            if self.stderr_path is not None:
                self._stderr = stack.enter_context(self.stderr_path.open("ab"))
            started = time.perf_counter()
            process = await anyio.open_process(
                [self.python, "-m", "provider"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr if self._stderr is not None else subprocess.DEVNULL,
                cwd=REPO_ROOT,
                env=host_environment(self.extra_env),
            )
            self._process = process
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            # Runs first on exit, while the reader still routes the shutdown answer.
            stack.push_async_callback(self._stop_process, process)
            tg.start_soon(self._read_loop, process)
            result = await self._request("initialize", _initialize_params(), INITIALIZE_TIMEOUT_S)
            if not isinstance(result, dict) or result.get("ok") is not True:
                raise PeerCallError(None, "the worker refused initialize")
            self.supported_methods = list(result.get("supportedMethods") or [])
            self.start_ms = (time.perf_counter() - started) * 1000
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.__aexit__(exc_type, exc, tb)

    async def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        timeout_ms: int = 30_000,
        on_log: LogCallback | None = None,
    ) -> Any:
        """One host call; live ``execute.log`` chunks of it go to ``on_log(stream, chunk)``."""
        invocation: dict[str, Any] | None = None
        company_id = params.get("companyId")
        if isinstance(company_id, str):
            invocation = {"id": str(uuid.uuid4()), "scope": {"companyId": company_id}}
        if invocation is not None and on_log is not None:
            self._sinks[invocation["id"]] = on_log
        try:
            return await self._request(method, dict(params), timeout_ms / 1000, invocation)
        finally:
            if invocation is not None:
                self._sinks.pop(invocation["id"], None)

    async def _request(
        self,
        method: str,
        params: dict[str, Any],
        timeout_s: float,
        invocation: dict[str, Any] | None = None,
    ) -> Any:
        if self._closed:
            raise PeerCallError(-32000, "the worker is not running")
        request_id = next(self._ids)
        done = anyio.Event()
        self._pending[request_id] = done
        message: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": method,
            "params": params,
        }
        if invocation is not None:
            message["paperclipInvocation"] = invocation
        try:
            await self._send(message)
            with anyio.fail_after(timeout_s):
                await done.wait()
        except TimeoutError:
            raise PeerCallError(-32003, f"{method} timed out after {timeout_s:g} s") from None
        finally:
            self._pending.pop(request_id, None)
        answer = self._answers.pop(request_id)
        if "error" in answer:
            error = answer["error"] if isinstance(answer["error"], dict) else {}
            code = error.get("code")
            raise PeerCallError(code if isinstance(code, int) else None, str(error.get("message")))
        return answer.get("result")

    async def _send(self, message: dict[str, Any]) -> None:
        process = self._process
        if process is None or process.stdin is None:
            raise PeerCallError(-32000, "the worker is not running")
        line = json.dumps(message, ensure_ascii=True, separators=(",", ":")) + "\n"
        async with self._write_lock:
            try:
                await process.stdin.send(line.encode())
            except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                raise PeerCallError(-32000, "the worker closed its input") from exc

    async def _read_loop(self, process: anyio.abc.Process) -> None:
        assert process.stdout is not None
        reader = LineReader(process.stdout)
        try:
            while True:
                try:
                    line = await reader.receive_line()
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    break
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # the real host logs and drops such lines
                if isinstance(message, dict):
                    await self._route(message)
        finally:
            self._closed = True
            for request_id, event in list(self._pending.items()):
                self._answers.setdefault(
                    request_id, {"error": {"code": -32000, "message": "the worker exited"}}
                )
                event.set()

    async def _route(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        request_id = message.get("id")
        if isinstance(method, str) and request_id is not None:  # a request from the worker
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
            if method == "config.get":
                reply["result"] = {}
            else:
                reply["error"] = {"code": METHOD_NOT_FOUND, "message": f"no host method {method}"}
            with suppress(PeerCallError):  # the worker is going away; its calls fail on their own
                await self._send(reply)
        elif method == "execute.log":
            params = message.get("params") or {}
            sink = self._sinks.get(str(message.get("paperclipInvocationId")))
            stream, chunk = params.get("stream"), params.get("chunk")
            if sink is not None and stream in ("stdout", "stderr") and isinstance(chunk, str):
                sink(stream, chunk)
        elif isinstance(request_id, int) and request_id in self._pending:
            self._answers[request_id] = message
            self._pending[request_id].set()

    async def _stop_process(self, process: anyio.abc.Process) -> None:
        """``shutdown``, end of input, then SIGTERM/SIGKILL if the worker lingers."""
        with anyio.CancelScope(shield=True):
            if not self._closed:
                with anyio.move_on_after(SHUTDOWN_WAIT_S):
                    with suppress(PeerCallError):
                        await self._request("shutdown", {}, SHUTDOWN_WAIT_S)
            if process.stdin is not None:
                await process.stdin.aclose()
            with anyio.move_on_after(EXIT_WAIT_S):
                await process.wait()
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(EXIT_WAIT_S):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            self.exit_code = process.returncode
            await process.aclose()


def _initialize_params() -> dict[str, Any]:
    return {
        "manifest": json.loads((REPO_ROOT / "manifest.json").read_text()),
        "config": {},
        "apiVersion": 1,
        "databaseNamespace": None,
        "instanceInfo": {
            "instanceId": "stdio-host",
            "hostVersion": "0.0.0",
            "deploymentMode": "local_trusted",
            "deploymentExposure": "private",
        },
    }
