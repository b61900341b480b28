"""Composition root: the driver's method table, the stdio handshake and the dispatcher.

Nothing heavy is imported at module level: ``run_stdio`` answers ``initialize`` with the
standard library first (:mod:`provider.rpc.handshake`), then imports anyio and the dispatcher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from provider.rpc.handshake import (
    answer_initialize,
    die_with_parent,
    exit_on_stop_signals,
    guard_stdout,
    initialize_request_id,
    read_first_line,
    supported_methods,
)

if TYPE_CHECKING:
    from provider.driver.methods import MethodHandler
    from provider.rpc.dispatcher import Dispatcher


class _HostChannel:
    """notify/log for the driver, bound to the dispatcher once it exists."""

    def __init__(self) -> None:
        self.dispatcher: Dispatcher | None = None

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        assert self.dispatcher is not None, "the dispatcher is not running yet"
        await self.dispatcher.notify(method, params)

    async def log(self, level: str, message: str, meta: dict[str, Any] | None = None) -> None:
        assert self.dispatcher is not None, "the dispatcher is not running yet"
        await self.dispatcher.log(level, message, meta)


def _driver_table() -> tuple[dict[str, MethodHandler], _HostChannel]:
    from provider.driver import methods

    channel = _HostChannel()
    return methods.method_table(channel.notify, channel.log), channel


def build_dispatcher(*, initialized: bool = False) -> Dispatcher:
    """The dispatcher serving every registered driver method, with the driver's shutdown hook."""
    from provider.driver import methods
    from provider.driver.core.text_params import lone_surrogate_policy
    from provider.rpc.dispatcher import Dispatcher

    table, channel = _driver_table()
    dispatcher = Dispatcher(
        table,
        on_shutdown=methods.shutdown,
        initialized=initialized,
        text_policy=lone_surrogate_policy,
    )
    channel.dispatcher = dispatcher
    return dispatcher


def run_stdio() -> None:
    """The worker process: guard fd 1, answer ``initialize``, die with the shim, then serve."""
    exit_on_stop_signals()
    protocol_fd = guard_stdout()
    table, channel = _driver_table()
    line, rest = read_first_line(0)
    request_id = initialize_request_id(line)
    if request_id is not None:
        answer_initialize(protocol_fd, request_id, supported_methods(table))
        already_read = rest
    else:  # not an initialize: the dispatcher answers it (or reads the end of input)
        already_read = line + b"\n" + rest if line or rest else b""
    # After the reply (ctypes costs start-up time): a shim that died meanwhile is caught by the
    # pid check, and one killed while we waited for input closed our stdin anyway.
    die_with_parent()

    import anyio

    from provider.driver import methods
    from provider.driver.core.text_params import lone_surrogate_policy
    from provider.rpc.dispatcher import Dispatcher
    from provider.rpc.runner import serve_stdio

    dispatcher = Dispatcher(
        table,
        on_shutdown=methods.shutdown,
        initialized=request_id is not None,
        text_policy=lone_surrogate_policy,
    )
    channel.dispatcher = dispatcher

    async def serve() -> None:
        # Background work (the reaper's sweeps) lives as long as the worker; shutdown cancels it.
        async with methods.background():
            await serve_stdio(protocol_fd, dispatcher, already_read)

    anyio.run(serve)
