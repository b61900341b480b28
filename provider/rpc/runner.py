"""Runs a dispatcher on the process's stdio, stopping it cleanly on SIGTERM, SIGINT or SIGHUP."""

from __future__ import annotations

import signal

import anyio
import anyio.abc

from provider.rpc.dispatcher import Dispatcher
from provider.rpc.stdio import FdReceiveStream, FdSendStream, PrefixedReceiveStream


async def _stop_on_signal(
    dispatcher: Dispatcher, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        task_status.started()
        async for _ in signals:
            await dispatcher.stop()
            return


async def serve_stdio(protocol_fd: int, dispatcher: Dispatcher, already_read: bytes = b"") -> None:
    """Serve on stdin / ``protocol_fd`` until shutdown, end of input or a stop signal.

    ``already_read`` holds input bytes consumed before (by the handshake); they come first.
    """
    receive = PrefixedReceiveStream(already_read, FdReceiveStream(0))
    send = FdSendStream(protocol_fd)
    async with anyio.create_task_group() as tg:
        await tg.start(_stop_on_signal, dispatcher)  # handlers in place before serving
        try:
            await dispatcher.serve(receive, send)
        finally:
            tg.cancel_scope.cancel()
            await receive.aclose()
            await send.aclose()
