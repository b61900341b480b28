"""A small Python host that speaks the Paperclip stdio protocol to ``python -m provider``.

It does what the worker manager does for our verbs (docs/protocol.md H1-H5) and nothing more:
spawns the worker with the host's scrubbed environment (plus what the caller adds), sends
``initialize``, adds a ``paperclipInvocation`` to every call that carries a ``companyId``,
routes ``execute.log`` notifications by the invocation id the worker echoes, keeps ``log``
notifications, hands every other notification (``duplexChannel.*``, ``loginPty.*``) to
``on_notification(method, params)`` if given, answers ``config.get`` with ``{}``, and stops the
worker with ``shutdown`` then end of input (SIGTERM, then SIGKILL, if it lingers)::

    async with StdioHost(env={"XDG_STATE_HOME": ...}) as host:
        result = await host.call("environmentExecute", params, on_log=print_chunk)

It routes no pair itself: a caller that opens a login terminal or a duplex channel follows its
notifications by ``hostRouteId`` in ``on_notification``.

The pipes are read and written without blocking, stdout in 1 MiB gulps (what a host with a big
buffer does). With ``record=True`` every raw byte of stdout and stderr is kept, and every parsed
message. Used by the demo's fallback host, the reliability tests and the benches.
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
from typing import IO, Any, Final, Literal, Self

import anyio
import anyio.abc
import anyio.to_thread

from devtools.host_peer import REPO_ROOT
from devtools.peer_sessions import PeerCallError
from provider.rpc import wire
from provider.rpc.stdio import FdReceiveStream, FdSendStream, LineReader

LogCallback = Callable[[str, str], None]
NotificationCallback = Callable[[str, dict[str, Any]], None]
StderrTarget = Path | Literal["discard", "inherit"]
READ_BYTES: Final = 1024 * 1024
INITIALIZE_TIMEOUT_S: Final = 15.0
SHUTDOWN_WAIT_S: Final = 15.0
EXIT_WAIT_S: Final = 15.0
DRAIN_WAIT_S: Final = 5.0


class WorkerCallError(PeerCallError):
    """A call failed: the worker's JSON-RPC error (``error``), or the worker went away."""

    def __init__(self, error: dict[str, Any]) -> None:
        code = error.get("code")
        super().__init__(code if isinstance(code, int) else None, str(error.get("message")))
        self.error = error


def host_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the 916.1 worker manager passes (docs/protocol.md H1), plus what the shim adds."""
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
        stderr: StderrTarget = "discard",
        record: bool = False,
        on_notification: NotificationCallback | None = None,
    ) -> None:
        """``stderr``: a file to append the worker's stderr to, or discard/inherit it;
        ``record``: keep raw stdout/stderr (stderr is then piped here) and parsed messages;
        ``on_notification``: called (on the reader task, so keep it short) with the method and
        params of every notification other than ``execute.log`` and ``log``."""
        self.python = python
        self.env = host_environment(env)
        self.stderr_target = stderr
        self.record = record
        self.on_notification = on_notification
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.messages: list[dict[str, Any]] = []
        self.host_logs: list[dict[str, Any]] = []
        self.supported_methods: list[str] = []
        self.start_ms = 0.0
        self.returncode: int | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, anyio.Event] = {}
        self._answers: dict[int, dict[str, Any]] = {}
        self._sinks: dict[str, LogCallback] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._send_stream: FdSendStream | None = None
        self._stack: AsyncExitStack | None = None
        self._closed = False
        self._drained: list[anyio.Event] = []
        self._write_lock = anyio.Lock()

    @property
    def worker_pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    async def __aenter__(self) -> Self:
        async with AsyncExitStack() as stack:
            err: IO[bytes] | int | None = subprocess.DEVNULL
            if self.record:
                err = subprocess.PIPE
            elif isinstance(self.stderr_target, Path):
                err = stack.enter_context(self.stderr_target.open("ab"))
            elif self.stderr_target == "inherit":
                err = None
            started = time.perf_counter()
            # Forked from the loop thread, never from a pool thread: the worker's
            # PR_SET_PDEATHSIG fires when the *thread* that forked it exits, and anyio retires
            # idle pool threads after 10 s (which SIGTERMed the worker mid-run).
            process = self._spawn(err)
            self._process = process
            stack.callback(_close_pipes, process)
            assert process.stdin is not None and process.stdout is not None
            self._send_stream = FdSendStream(process.stdin.fileno())
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            # Runs first on exit, while the reader still routes the shutdown answer.
            stack.push_async_callback(self._stop_process, process)
            tg.start_soon(self._read_stdout, FdReceiveStream(process.stdout.fileno()))
            if process.stderr is not None:
                tg.start_soon(self._read_stderr, FdReceiveStream(process.stderr.fileno()))
            result = await self._request("initialize", _initialize_params(), INITIALIZE_TIMEOUT_S)
            if not isinstance(result, dict) or result.get("ok") is not True:
                raise WorkerCallError({"message": "the worker refused initialize"})
            self.supported_methods = list(result.get("supportedMethods") or [])
            self.start_ms = (time.perf_counter() - started) * 1000
            self._stack = stack.pop_all()
        return self

    def _spawn(self, stderr: IO[bytes] | int | None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [self.python, "-m", "provider"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=REPO_ROOT,
            env=self.env,
        )

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
        timeout_ms: int | None = None,
        on_log: LogCallback | None = None,
    ) -> Any:
        """One host call (no deadline unless ``timeout_ms``); live ``execute.log`` chunks of it
        go to ``on_log(stream, chunk)``. Failures raise :class:`WorkerCallError`."""
        invocation: dict[str, Any] | None = None
        company_id = params.get("companyId")
        if isinstance(company_id, str):
            invocation = {"id": str(uuid.uuid4()), "scope": {"companyId": company_id}}
        if invocation is not None and on_log is not None:
            self._sinks[invocation["id"]] = on_log
        timeout_s = timeout_ms / 1000 if timeout_ms is not None else None
        try:
            return await self._request(method, dict(params), timeout_s, invocation)
        finally:
            if invocation is not None:
                self._sinks.pop(invocation["id"], None)

    async def _request(
        self,
        method: str,
        params: dict[str, Any],
        timeout_s: float | None,
        invocation: dict[str, Any] | None = None,
    ) -> Any:
        if self._closed:
            raise WorkerCallError(
                {"code": wire.WORKER_UNAVAILABLE, "message": "the worker is not running"}
            )
        request_id = next(self._ids)
        done = anyio.Event()
        self._pending[request_id] = done
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        message["params"] = params
        if invocation is not None:
            message["paperclipInvocation"] = invocation
        try:
            await self._send(message)
            with anyio.fail_after(timeout_s):
                await done.wait()
        except TimeoutError:
            error = {"code": wire.TIMEOUT, "message": f"{method} timed out after {timeout_s:g} s"}
            raise WorkerCallError(error) from None
        finally:
            self._pending.pop(request_id, None)
        answer = self._answers.pop(request_id)
        if "error" in answer:
            error = answer["error"]
            raise WorkerCallError(error if isinstance(error, dict) else {"message": str(error)})
        return answer.get("result")

    async def _send(self, message: dict[str, Any]) -> None:
        stream = self._send_stream
        if stream is None:
            raise WorkerCallError(
                {"code": wire.WORKER_UNAVAILABLE, "message": "the worker is not running"}
            )
        line = json.dumps(message, ensure_ascii=True, separators=(",", ":")) + "\n"
        async with self._write_lock:
            try:
                await stream.send(line.encode())
            except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                error = {"code": wire.WORKER_UNAVAILABLE, "message": "the worker closed its input"}
                raise WorkerCallError(error) from exc

    async def _read_stdout(self, stream: FdReceiveStream) -> None:
        drained = anyio.Event()
        self._drained.append(drained)
        reader = LineReader(_Gulps(stream, self.stdout if self.record else None))
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
            drained.set()
            await stream.aclose()
            for request_id, event in list(self._pending.items()):
                self._answers.setdefault(
                    request_id,
                    {"error": {"code": wire.WORKER_UNAVAILABLE, "message": "the worker exited"}},
                )
                event.set()

    async def _read_stderr(self, stream: FdReceiveStream) -> None:
        drained = anyio.Event()
        self._drained.append(drained)
        try:
            while True:
                self.stderr += await stream.receive(READ_BYTES)
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            pass
        finally:
            drained.set()
            await stream.aclose()

    async def _route(self, message: dict[str, Any]) -> None:
        if self.record:
            self.messages.append(message)
        method = message.get("method")
        request_id = message.get("id")
        if isinstance(method, str) and request_id is not None:  # a request from the worker
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
            if method == "config.get":
                reply["result"] = {}
            else:
                reply["error"] = {
                    "code": wire.METHOD_NOT_FOUND,
                    "message": f"no host method {method}",
                }
            with suppress(WorkerCallError):  # the worker is going away; its calls fail anyway
                await self._send(reply)
        elif method == "execute.log":
            params = message.get("params") or {}
            sink = self._sinks.get(str(message.get("paperclipInvocationId")))
            stream, chunk = params.get("stream"), params.get("chunk")
            if sink is not None and stream in ("stdout", "stderr") and isinstance(chunk, str):
                sink(stream, chunk)
        elif method == "log":
            self.host_logs.append(message)
        elif isinstance(method, str):
            params = message.get("params")
            if self.on_notification is not None and isinstance(params, dict):
                self.on_notification(method, params)
        elif isinstance(request_id, int) and request_id in self._pending:
            self._answers[request_id] = message
            self._pending[request_id].set()

    async def _stop_process(self, process: subprocess.Popen[bytes]) -> None:
        """``shutdown``, end of input, then SIGTERM/SIGKILL if the worker lingers; then the
        readers drain what is left in the pipes."""
        with anyio.CancelScope(shield=True):
            if not self._closed:
                with anyio.move_on_after(SHUTDOWN_WAIT_S), suppress(WorkerCallError):
                    await self._request("shutdown", {}, SHUTDOWN_WAIT_S)
            if self._send_stream is not None:
                await self._send_stream.aclose()
            if process.stdin is not None:
                process.stdin.close()
            for signal_it in (None, process.terminate, process.kill):
                if signal_it is not None and process.poll() is None:
                    signal_it()
                with anyio.move_on_after(EXIT_WAIT_S):
                    await anyio.to_thread.run_sync(process.wait, abandon_on_cancel=True)
            self.returncode = process.poll()
            with anyio.move_on_after(DRAIN_WAIT_S):
                for drained in self._drained:
                    await drained.wait()


class _Gulps(anyio.abc.ByteReceiveStream):
    """Reads a pipe in :data:`READ_BYTES` gulps, keeping every byte in ``keep`` if given."""

    def __init__(self, inner: FdReceiveStream, keep: bytearray | None) -> None:
        self._inner = inner
        self._keep = keep

    async def receive(self, max_bytes: int = READ_BYTES) -> bytes:
        data = await self._inner.receive(max(max_bytes, READ_BYTES))
        if self._keep is not None:
            self._keep += data
        return data

    async def aclose(self) -> None:
        await self._inner.aclose()


def _close_pipes(process: subprocess.Popen[bytes]) -> None:
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


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
