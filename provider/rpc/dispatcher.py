"""The JSON-RPC dispatcher: one reader loop, one task per request, one locked writer.

It owns the built-in methods (``initialize``, ``health``, ``shutdown``, ``configChanged``), the
invocation context (a context variable set per request task, added by :meth:`Dispatcher.notify`
as top-level ``paperclipInvocationId``), and the ONE place where exceptions become JSON-RPC
errors: :class:`provider.errors.InvalidParams` -> -32602, any other
:class:`provider.errors.ProviderError` -> -32002 with its (public) message, anything else ->
-32002 with a generic message naming the method (the traceback goes to stderr; params are never
logged).

Shutdown (the ``shutdown`` request, stdin EOF or :meth:`Dispatcher.stop` from a signal handler)
runs one bounded cleanup: ``on_shutdown()`` (the driver aborts its work), then the remaining
request tasks are cancelled, then ``shutdown`` gets its ``null`` reply and :meth:`serve` returns.

A reply is written whole however long the host takes to read it (an execute result can be tens
of MiB): only the shutdown, once its budget is spent, stops waiting on replies still going out.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.abc

from provider.errors import InvalidParams, ProviderError
from provider.replies import AfterReply
from provider.rpc import wire
from provider.rpc.calllog import CallLog
from provider.rpc.handshake import supported_methods
from provider.rpc.stdio import LineReader
from provider.verbs import SERVED_VERBS

if TYPE_CHECKING:  # imported lazily: keeps start-up fast
    from anyio.streams.memory import MemoryObjectSendStream

Handler = Callable[[dict[str, Any]], Awaitable[Any]]

BUILTIN_METHODS: Final = ("initialize", "health", "shutdown", "configChanged")

# Host -> worker methods the SDK knows as optional hooks: answered -32004 when we do not serve
# them (what an SDK worker does), anything else unknown gets -32601.
SDK_OPTIONAL_METHODS: Final = frozenset(
    {
        "validateConfig",
        "onEvent",
        "runJob",
        "handleWebhook",
        "handleApiRequest",
        "getData",
        "performAction",
        "executeTool",
        "detectExternalObjects",
        "resolveExternalObject",
        "refreshExternalObjects",
        "environmentRunnerIngressEndpoint",
        *SERVED_VERBS,
    }
)

SHUTDOWN_BUDGET_S: Final = 8.0  # on_shutdown + cancelling the remaining request tasks
CANCEL_GRACE_S: Final = 1.0  # part of the budget kept for the cancelled request tasks
REPLY_BUDGET_S: Final = 1.0  # writing the shutdown reply, or a reply once the shutdown cut them

_invocation_id: ContextVar[str | None] = ContextVar("paperclip_invocation_id", default=None)


def current_invocation_id() -> str | None:
    """The ``paperclipInvocation.id`` of the host request being served by this task, if any."""
    return _invocation_id.get()


def stderr_line(text: str) -> None:
    """One diagnostic line on stderr (the host logs each stderr line at warn level)."""
    try:
        sys.stderr.write(f"paperclip-createos: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _unwrap(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def error_for_exception(method: str, exc: Exception) -> tuple[int, str]:
    """The JSON-RPC (code, message) for an exception raised while serving ``method``."""
    leaf = _unwrap(exc)
    if isinstance(leaf, InvalidParams):
        return wire.INVALID_PARAMS, str(leaf)
    if isinstance(leaf, ProviderError):
        return wire.WORKER_ERROR, str(leaf)
    stderr_line(
        f"{method} failed with an unexpected error:\n"
        + "".join(traceback.format_exception(exc)).rstrip()
    )
    return wire.WORKER_ERROR, f"{method} failed: internal worker error (details in the worker log)"


class _Writer:
    """Serializes whole lines onto the send stream: encode outside the lock, one send inside."""

    def __init__(self, stream: anyio.abc.ByteSendStream) -> None:
        self._stream = stream
        self._lock = anyio.Lock()

    async def write(self, message: dict[str, Any]) -> None:
        line = wire.encode_line(message)
        async with self._lock:
            await self._stream.send(line)


_WRITE_FAILURES: Final = (anyio.BrokenResourceError, anyio.ClosedResourceError)


class Dispatcher:
    """Serves the host's JSON-RPC requests on a pair of byte streams."""

    def __init__(
        self,
        methods: Mapping[str, Handler],
        *,
        on_shutdown: Callable[[], Awaitable[None]] | None = None,
        initialized: bool = False,
    ) -> None:
        """``initialized=True`` when ``initialize`` was already answered (see ``handshake``)."""
        clashes = sorted(set(methods) & set(BUILTIN_METHODS))
        if clashes:
            raise ValueError(f"built-in methods cannot be replaced: {clashes}")
        self._methods = dict(methods)
        self._on_shutdown = on_shutdown
        self.supported_methods: tuple[str, ...] = supported_methods(self._methods)
        self._initialized = initialized
        self._stopping = False
        self._writer: _Writer | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._active: dict[int, anyio.CancelScope] = {}
        self._serial = itertools.count()
        self._idle: anyio.Event | None = None
        self._stopped: anyio.Event | None = None
        self._host_ids = itertools.count(1)
        self._host_calls: dict[wire.RequestId, MemoryObjectSendStream[wire.Response]] = {}
        self._call_log = CallLog.from_environment()
        self._replying: set[anyio.CancelScope] = set()  # replies being written
        self._replies_cut = False

    # --- serving -----------------------------------------------------------------------------

    async def serve(
        self, receive: anyio.abc.ByteReceiveStream, send: anyio.abc.ByteSendStream
    ) -> None:
        """Serve until ``shutdown``, end of input, or :meth:`stop`; returns after the cleanup."""
        if self._writer is not None:
            raise RuntimeError("a Dispatcher serves only once")
        self._writer = _Writer(send)
        self._idle = anyio.Event()
        self._idle.set()
        self._stopped = anyio.Event()
        reader = LineReader(receive)
        async with anyio.create_task_group() as tg:
            self._task_group = tg
            await self._read_loop(reader)
        self._task_group = None

    async def _read_loop(self, reader: LineReader) -> None:
        while True:
            try:
                line = await reader.receive_line()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                break
            self._dispatch_line(line)
        # End of input: the host is gone or going; same bounded cleanup as shutdown.
        await self.stop()

    def _dispatch_line(self, line: bytes) -> None:
        assert self._task_group is not None
        message = wire.decode_line(line)
        if isinstance(message, wire.Request):
            if self._stopping:
                self._task_group.start_soon(
                    self._send_reply,
                    wire.error_message(
                        message.id,
                        wire.WORKER_ERROR,
                        f"{message.method} refused: the worker is shutting down",
                    ),
                )
            elif message.method == "shutdown":
                self._task_group.start_soon(self._shutdown_request, message.id)
            else:
                self._start_request(message)
        elif isinstance(message, wire.Response):
            self._route_response(message)
        elif isinstance(message, wire.Invalid):
            self._task_group.start_soon(
                self._send_reply, wire.error_message(message.id, message.code, message.message)
            )
        # Host notifications (onEvent and the like) are for event-bus plugins: ignored.

    def _start_request(self, request: wire.Request) -> None:
        assert self._task_group is not None and self._idle is not None
        key = next(self._serial)
        scope = anyio.CancelScope()
        self._active[key] = scope
        if self._idle.is_set():
            self._idle = anyio.Event()
        self._task_group.start_soon(self._serve_request, key, scope, request)

    async def _serve_request(
        self, key: int, scope: anyio.CancelScope, request: wire.Request
    ) -> None:
        _invocation_id.set(request.invocation_id)
        arrived = time.monotonic()
        try:
            response: dict[str, Any] | None = None
            written: Callable[[], None] | None = None
            with scope:
                response, written = await self._respond(request)
            if response is None:  # our own scope was cancelled: the worker is shutting down
                response = wire.error_message(
                    request.id,
                    wire.WORKER_ERROR,
                    f"{request.method} was cancelled: the worker is shutting down",
                )
            reply_scope = self._reply_scope()
            try:
                with reply_scope:
                    try:
                        await self._send_reply(response)
                    finally:
                        if written is not None:
                            written()  # the session's notifications may follow now
                    if self._call_log is not None:
                        await self._call_log.record(
                            request.method, arrived, "error" not in response
                        )
            finally:
                self._replying.discard(reply_scope)
        finally:
            del self._active[key]
            if not self._active and self._idle is not None:
                self._idle.set()

    async def _respond(
        self, request: wire.Request
    ) -> tuple[dict[str, Any], Callable[[], None] | None]:
        """The response, and what to call once it is written (see :class:`AfterReply`)."""
        method = request.method
        handler = self._handler_for(method)
        if handler is None:
            if method in SDK_OPTIONAL_METHODS:
                return wire.error_message(
                    request.id,
                    wire.METHOD_NOT_IMPLEMENTED,
                    f"{method} is not implemented by this plugin",
                ), None
            return wire.error_message(
                request.id, wire.METHOD_NOT_FOUND, f"Method not found: {method}"
            ), None
        if not request.has_params or not isinstance(request.params, dict):
            return wire.error_message(
                request.id, wire.INVALID_PARAMS, f"Invalid params: {method} expects an object"
            ), None
        if not self._initialized and method != "initialize":
            return wire.error_message(
                request.id,
                wire.WORKER_ERROR,
                f"{method} refused: the worker has not been initialized yet",
            ), None
        try:
            result = await handler(request.params)
        except Exception as exc:
            code, text = error_for_exception(method, exc)
            return wire.error_message(request.id, code, text), None
        if isinstance(result, AfterReply):
            return wire.result_message(request.id, result.result), result.written
        return wire.result_message(request.id, result), None

    def _reply_scope(self) -> anyio.CancelScope:
        """The scope a request's reply is written in.

        Shielded from the shutdown's cancellation of the request, and with no time limit while
        serving: a result of tens of MiB takes the host a while to read, and a reply cut off
        by a deadline would never arrive. Only the shutdown bounds it (:meth:`_cut_replies`).
        """
        scope = anyio.CancelScope(shield=True)
        if self._replies_cut:
            scope.deadline = anyio.current_time() + REPLY_BUDGET_S
        self._replying.add(scope)
        return scope

    def _cut_replies(self) -> None:
        """The shutdown budget is spent: stop waiting on replies the host is not reading.

        A reply cut while it is being written is not lost half-way: the send stream writes the
        rest before the next line (the shutdown reply), within that line's own budget.
        """
        self._replies_cut = True
        for scope in self._replying:
            scope.cancel()

    def _handler_for(self, method: str) -> Handler | None:
        builtin = {
            "initialize": self._initialize,
            "health": self._health,
            "configChanged": self._config_changed,
        }.get(method)
        return builtin if builtin is not None else self._methods.get(method)

    async def _send_reply(self, message: dict[str, Any]) -> None:
        """Write a response; an unencodable result becomes an error response instead."""
        assert self._writer is not None
        try:
            try:
                await self._writer.write(message)
            except (TypeError, ValueError, OverflowError):
                method_id = message.get("id")
                stderr_line(
                    f"reply to request {method_id!r} could not be encoded:\n"
                    + traceback.format_exc().rstrip()
                )
                await self._writer.write(
                    wire.error_message(
                        method_id if isinstance(method_id, int | str) else None,
                        wire.WORKER_ERROR,
                        "the worker produced a result that cannot be sent as JSON",
                    )
                )
        except _WRITE_FAILURES:
            self._output_lost()

    def _output_lost(self) -> None:
        """Our stdout is gone: nobody can hear us any more, so wind down."""
        if not self._stopping and self._task_group is not None:
            stderr_line("the host stopped reading our output; shutting down")
            self._task_group.start_soon(self.stop)

    # --- built-in methods --------------------------------------------------------------------

    async def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        if self._initialized:
            raise ProviderError("initialize refused: the worker is already initialized")
        self._initialized = True
        return {"ok": True, "supportedMethods": list(self.supported_methods)}

    async def _health(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"status": "ok"}

    async def _config_changed(self, params: dict[str, Any]) -> None:
        # Plugin-level config is unused; answering -32004 would make the host restart us.
        return None

    async def _shutdown_request(self, request_id: wire.RequestId) -> None:
        await self.stop(reply_to=request_id)

    # --- shutdown ----------------------------------------------------------------------------

    async def stop(self, *, reply_to: wire.RequestId | None = None) -> None:
        """Run the bounded shutdown cleanup (once), reply ``null`` to ``reply_to``, end serving."""
        if self._stopped is None:  # never served
            self._stopping = True
            return
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        try:
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(SHUTDOWN_BUDGET_S):
                    await self._cleanup()
                self._cut_replies()
                if reply_to is not None:
                    with anyio.move_on_after(REPLY_BUDGET_S):
                        await self._send_reply(wire.result_message(reply_to, None))
        finally:
            self._stopped.set()
            if self._task_group is not None:
                self._task_group.cancel_scope.cancel()

    async def _cleanup(self) -> None:
        if self._on_shutdown is not None:
            with anyio.move_on_after(SHUTDOWN_BUDGET_S - CANCEL_GRACE_S):
                try:
                    await self._on_shutdown()
                except Exception as exc:
                    stderr_line(
                        "shutdown cleanup failed:\n"
                        + "".join(traceback.format_exception(exc)).rstrip()
                    )
        # Requests dispatched just before the shutdown began get one turn to run (a quick
        # method answers within it); whatever is still running then is cancelled.
        from anyio.lowlevel import checkpoint

        await checkpoint()
        for scope in list(self._active.values()):
            scope.cancel()
        if self._idle is not None:
            await self._idle.wait()

    # --- messages we send --------------------------------------------------------------------

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        """Send a notification, tagged with the current request's invocation id (if any)."""
        if self._writer is None:
            raise RuntimeError("the dispatcher is not serving")
        message = wire.notification_message(method, params, _invocation_id.get())
        try:
            await self._writer.write(message)
        except _WRITE_FAILURES:
            self._output_lost()

    async def log(self, level: str, message: str, meta: dict[str, Any] | None = None) -> None:
        """A structured ``log`` notification (level: debug, info, warn or error)."""
        params: dict[str, Any] = {"level": level, "message": message}
        if meta is not None:
            params["meta"] = meta
        await self.notify("log", params)

    async def call_host(self, method: str, params: dict[str, Any]) -> Any:
        """Send a request to the host and wait for its result (our own id space).

        Raises :class:`HostCallError` when the host answers with an error. Callers bound the
        wait with their own cancel scope.
        """
        if self._writer is None:
            raise RuntimeError("the dispatcher is not serving")
        request_id = next(self._host_ids)
        send, receive = anyio.create_memory_object_stream[wire.Response](1)
        with send, receive:
            self._host_calls[request_id] = send
            try:
                await self._writer.write(
                    wire.request_message(request_id, method, params, _invocation_id.get())
                )
                response = await receive.receive()
            finally:
                self._host_calls.pop(request_id, None)
        if response.error is not None:
            code = response.error.get("code")
            raise HostCallError(
                code if isinstance(code, int) else wire.INTERNAL_ERROR,
                str(response.error.get("message", "")),
            )
        return response.result

    def _route_response(self, response: wire.Response) -> None:
        send = self._host_calls.pop(response.id, None)
        if send is None:
            stderr_line(f"ignored a response to unknown request id {response.id!r}")
            return
        with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError):
            send.send_nowait(response)


class HostCallError(Exception):
    """The host answered one of our requests with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"host error {code}: {message}")
        self.code = code
        self.message = message
