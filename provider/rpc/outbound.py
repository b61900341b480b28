"""What the worker sends on its own: notifications, log lines and requests to the host.

:class:`Outbound` owns the one writer of the protocol stream (whole lines, one at a time) and
our own request-id space; :class:`provider.rpc.dispatcher.Dispatcher` builds on it, opens it on
its send stream, routes the host's responses to :meth:`Outbound._route_response` and decides
what happens when the output is lost. Every notification and request carries the invocation id
of the host request whose task sends it (a context variable the dispatcher sets per request).
"""

from __future__ import annotations

import contextlib
import itertools
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.abc

from provider.rpc import wire
from provider.rpc.errors import HostCallError, stderr_line

if TYPE_CHECKING:  # imported lazily: keeps start-up fast
    from anyio.streams.memory import MemoryObjectSendStream

WRITE_FAILURES: Final = (anyio.BrokenResourceError, anyio.ClosedResourceError)

invocation_id: ContextVar[str | None] = ContextVar("paperclip_invocation_id", default=None)


def current_invocation_id() -> str | None:
    """The ``paperclipInvocation.id`` of the host request being served by this task, if any."""
    return invocation_id.get()


class Writer:
    """Serializes whole lines onto the send stream: encode outside the lock, one send inside."""

    def __init__(self, stream: anyio.abc.ByteSendStream) -> None:
        self._stream = stream
        self._lock = anyio.Lock()

    async def write(self, message: dict[str, Any]) -> None:
        line = wire.encode_line(message)
        async with self._lock:
            await self._stream.send(line)


class Outbound:
    """The sending half of a worker session (see the module docstring)."""

    def __init__(self) -> None:
        self._writer: Writer | None = None
        self._host_ids = itertools.count(1)
        self._host_calls: dict[wire.RequestId, MemoryObjectSendStream[wire.Response]] = {}

    def _open_output(self, send: anyio.abc.ByteSendStream) -> None:
        if self._writer is not None:
            raise RuntimeError("a Dispatcher serves only once")
        self._writer = Writer(send)

    def _output_lost(self) -> None:
        """Our output stream is gone (the subclass winds down)."""
        raise NotImplementedError

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        """Send a notification, tagged with the current request's invocation id (if any)."""
        if self._writer is None:
            raise RuntimeError("the dispatcher is not serving")
        message = wire.notification_message(method, params, invocation_id.get())
        try:
            await self._writer.write(message)
        except WRITE_FAILURES:
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
                    wire.request_message(request_id, method, params, invocation_id.get())
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
