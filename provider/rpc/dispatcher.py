"""The JSON-RPC dispatcher: one reader loop, one task per request, one locked writer.

It owns the built-in methods (``initialize``, ``health``, ``shutdown``, ``configChanged``) and
sets the invocation context per request task (:mod:`provider.rpc.outbound`, which sends our own
notifications and requests, tags them with it). Every exception a handler raises becomes a
JSON-RPC error through :func:`provider.rpc.errors.error_for_exception`, the one place for that.

Shutdown (the ``shutdown`` request, stdin EOF or :meth:`Dispatcher.stop` from a signal handler)
runs one bounded cleanup: ``on_shutdown()`` (the driver aborts its work), then the remaining
request tasks are cancelled, then ``shutdown`` gets its ``null`` reply and :meth:`serve` returns.

A reply is written whole however long the host takes to read it (an execute result can be tens
of MiB): only the shutdown, once its budget is spent, stops waiting on replies still going out.

A request holding a lone UTF-16 surrogate (:mod:`provider.rpc.wire`) is answered under its id:
its params go through ``text_policy`` (given by the composition root: which strings may have
them replaced and which are refused) and are refused whole without one.
"""

from __future__ import annotations

import itertools
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import anyio
import anyio.abc

from provider.errors import InvalidParams, RequestRefused
from provider.replies import AfterReply
from provider.rpc import wire
from provider.rpc.calllog import CallLog
from provider.rpc.errors import error_for_exception, failure_log_level, stderr_line
from provider.rpc.handshake import supported_methods
from provider.rpc.outbound import WRITE_FAILURES, Outbound, invocation_id
from provider.rpc.stdio import LineReader
from provider.verbs import SERVED_VERBS

Handler = Callable[[dict[str, Any]], Awaitable[Any]]
# (method, params holding lone surrogates) -> params to serve; raises InvalidParams to refuse.
TextPolicy = Callable[[str, dict[str, Any]], dict[str, Any]]


def refuse_lone_surrogates(method: str, params: dict[str, Any]) -> dict[str, Any]:
    raise InvalidParams(
        f"Invalid params: a string in the params of {method} holds a lone UTF-16 surrogate "
        "(half of a character, such as an emoji cut in two); send whole characters."
    )


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


class Dispatcher(Outbound):
    """Serves the host's JSON-RPC requests on a pair of byte streams."""

    def __init__(
        self,
        methods: Mapping[str, Handler],
        *,
        on_shutdown: Callable[[], Awaitable[None]] | None = None,
        initialized: bool = False,
        text_policy: TextPolicy = refuse_lone_surrogates,
    ) -> None:
        """``initialized=True`` when ``initialize`` was already answered (see ``handshake``)."""
        clashes = sorted(set(methods) & set(BUILTIN_METHODS))
        if clashes:
            raise ValueError(f"built-in methods cannot be replaced: {clashes}")
        super().__init__()
        self._methods = dict(methods)
        self._on_shutdown = on_shutdown
        self._text_policy = text_policy
        self.supported_methods: tuple[str, ...] = supported_methods(self._methods)
        self._initialized = initialized
        self._stopping = False
        self._task_group: anyio.abc.TaskGroup | None = None
        self._active: dict[int, anyio.CancelScope] = {}
        self._serial = itertools.count()
        self._idle: anyio.Event | None = None
        self._stopped: anyio.Event | None = None
        self._call_log = CallLog.from_environment()
        self._replying: set[anyio.CancelScope] = set()  # replies being written
        self._replies_cut = False

    # --- serving -----------------------------------------------------------------------------

    async def serve(
        self, receive: anyio.abc.ByteReceiveStream, send: anyio.abc.ByteSendStream
    ) -> None:
        """Serve until ``shutdown``, end of input, or :meth:`stop`; returns after the cleanup."""
        self._open_output(send)
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
        invocation_id.set(request.invocation_id)
        arrived = time.monotonic()
        try:
            response: dict[str, Any] | None = None
            written: Callable[[bool], None] | None = None
            failure: tuple[str, str] | None = None
            with scope:
                response, written, failure = await self._respond(request)
            if response is None:  # our own scope was cancelled: the worker is shutting down
                response = wire.error_message(
                    request.id,
                    wire.WORKER_ERROR,
                    f"{request.method} was cancelled: the worker is shutting down",
                )
            reply_scope = self._reply_scope()
            try:
                with reply_scope:
                    if failure is not None:  # every failed request, once, at its level
                        await self.log(*failure)
                    delivered = False
                    try:
                        delivered = await self._send_reply(response)
                    finally:
                        if written is not None:
                            written(delivered)  # the session's notifications may follow now
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
    ) -> tuple[dict[str, Any], Callable[[bool], None] | None, tuple[str, str] | None]:
        """The response, what to call once it is written (see :class:`AfterReply`), and the
        (level, message) to log first when a handler failed: public text, never params."""
        method = request.method
        handler = self._handler_for(method)
        if handler is None:
            if method in SDK_OPTIONAL_METHODS:
                return (
                    wire.error_message(
                        request.id,
                        wire.METHOD_NOT_IMPLEMENTED,
                        f"{method} is not implemented by this plugin",
                    ),
                    None,
                    None,
                )
            return (
                wire.error_message(
                    request.id, wire.METHOD_NOT_FOUND, f"Method not found: {method}"
                ),
                None,
                None,
            )
        if not request.has_params or not isinstance(request.params, dict):
            return (
                wire.error_message(
                    request.id, wire.INVALID_PARAMS, f"Invalid params: {method} expects an object"
                ),
                None,
                None,
            )
        if not self._initialized and method != "initialize":
            return (
                wire.error_message(
                    request.id,
                    wire.WORKER_ERROR,
                    f"{method} refused: the worker has not been initialized yet",
                ),
                None,
                None,
            )
        try:
            params = request.params
            if request.lone_surrogates:
                params = self._text_policy(method, params)
            result = await handler(params)
        except Exception as exc:
            code, text = error_for_exception(method, exc)
            failure = (failure_log_level(exc), f"{method}: {text}")
            return wire.error_message(request.id, code, text), None, failure
        if isinstance(result, AfterReply):
            return wire.result_message(request.id, result.result), result.written, None
        return wire.result_message(request.id, result), None, None

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

    async def _send_reply(self, message: dict[str, Any]) -> bool:
        """Write a response; an unencodable result becomes an error response instead.
        True when ``message`` itself was written."""
        assert self._writer is not None
        try:
            try:
                await self._writer.write(message)
                return True
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
        except WRITE_FAILURES:
            self._output_lost()
        return False

    def _output_lost(self) -> None:
        """Our stdout is gone: nobody can hear us any more, so wind down."""
        if not self._stopping and self._task_group is not None:
            stderr_line("the host stopped reading our output; shutting down")
            self._task_group.start_soon(self.stop)

    # --- built-in methods --------------------------------------------------------------------

    async def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        if self._initialized:
            raise RequestRefused("initialize refused: the worker is already initialized")
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
