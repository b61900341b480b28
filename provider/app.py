"""Composition root: wires the driver's method table into a dispatcher and serves it on stdio."""

from __future__ import annotations

import signal
from typing import Any

import anyio
import anyio.abc

from provider.driver import methods
from provider.rpc.dispatcher import Dispatcher
from provider.rpc.stdio import FdReceiveStream, FdSendStream


def build_dispatcher() -> Dispatcher:
    """The dispatcher serving every registered driver method, with the driver's shutdown hook."""
    dispatcher: Dispatcher | None = None

    async def notify(method: str, params: dict[str, Any]) -> None:
        assert dispatcher is not None
        await dispatcher.notify(method, params)

    async def log(level: str, message: str, meta: dict[str, Any] | None = None) -> None:
        assert dispatcher is not None
        await dispatcher.log(level, message, meta)

    dispatcher = Dispatcher(methods.method_table(notify, log), on_shutdown=methods.shutdown)
    return dispatcher


async def _stop_on_signal(dispatcher: Dispatcher) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for _ in signals:
            await dispatcher.stop()
            return


async def serve_stdio(protocol_fd: int, dispatcher: Dispatcher | None = None) -> None:
    """Serve the host on stdin / ``protocol_fd`` until shutdown, end of input or a signal."""
    if dispatcher is None:
        dispatcher = build_dispatcher()
    receive = FdReceiveStream(0)
    send = FdSendStream(protocol_fd)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, dispatcher)
        try:
            await dispatcher.serve(receive, send)
        finally:
            tg.cancel_scope.cancel()
            await receive.aclose()
            await send.aclose()
