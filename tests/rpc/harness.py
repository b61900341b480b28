"""In-memory host for dispatcher tests: byte streams over anyio memory object streams."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from provider.rpc.dispatcher import Dispatcher
from provider.rpc.stdio import LineReader


class MemoryByteReceiveStream(anyio.abc.ByteReceiveStream):
    def __init__(self, inner: MemoryObjectReceiveStream[bytes]) -> None:
        self._inner = inner

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._inner.receive()

    async def aclose(self) -> None:
        await self._inner.aclose()


class MemoryByteSendStream(anyio.abc.ByteSendStream):
    def __init__(self, inner: MemoryObjectSendStream[bytes]) -> None:
        self._inner = inner
        self.sends = 0

    async def send(self, item: bytes) -> None:
        self.sends += 1
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()


class FakeHost:
    """The host side: writes request lines, reads the worker's lines."""

    def __init__(
        self,
        to_worker: MemoryObjectSendStream[bytes],
        from_worker: MemoryObjectReceiveStream[bytes],
    ) -> None:
        self._to_worker = to_worker
        self._from_worker = from_worker
        self._reader = LineReader(MemoryByteReceiveStream(from_worker))
        self.raw_lines: list[bytes] = []
        self.notifications: list[dict[str, Any]] = []
        self._next_id = 1000

    async def send_raw(self, data: bytes) -> None:
        await self._to_worker.send(data)

    async def send(self, message: dict[str, Any]) -> None:
        await self.send_raw(json.dumps(message).encode() + b"\n")

    async def send_request(
        self,
        method: str,
        params: Any = None,
        *,
        request_id: int | str | None = None,
        invocation_id: str | None = None,
        omit_params: bool = False,
    ) -> int | str:
        if request_id is None:
            self._next_id += 1
            request_id = self._next_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if not omit_params:
            message["params"] = {} if params is None else params
        if invocation_id is not None:
            message["paperclipInvocation"] = {
                "id": invocation_id,
                "scope": {"companyId": "c1"},
            }
        await self.send(message)
        return request_id

    async def receive(self) -> dict[str, Any]:
        """The next line the worker wrote, parsed (with a generous hang guard)."""
        with anyio.fail_after(10):
            line = await self._reader.receive_line()
        self.raw_lines.append(line)
        message: dict[str, Any] = json.loads(line)
        return message

    async def response_to(self, request_id: int | str) -> dict[str, Any]:
        """Read until the response for ``request_id``; notifications are collected on the way."""
        while True:
            message = await self.receive()
            if "method" in message and "id" not in message:
                self.notifications.append(message)
                continue
            if message.get("id") == request_id and "method" not in message:
                return message
            raise AssertionError(f"unexpected message while waiting for {request_id}: {message}")

    async def request(
        self, method: str, params: Any = None, *, invocation_id: str | None = None
    ) -> dict[str, Any]:
        request_id = await self.send_request(method, params, invocation_id=invocation_id)
        return await self.response_to(request_id)

    async def initialize(self) -> dict[str, Any]:
        response = await self.request("initialize", {"manifest": {}, "config": {}})
        assert response["result"]["ok"] is True
        return response

    async def close(self) -> None:
        """End of input for the worker (like the host closing stdin)."""
        await self._to_worker.aclose()


@asynccontextmanager
async def serving(dispatcher: Dispatcher) -> AsyncIterator[FakeHost]:
    """Run ``dispatcher.serve`` on memory streams; on exit, close its input and wait for it."""
    to_worker_send, to_worker_receive = anyio.create_memory_object_stream[bytes](math.inf)
    from_worker_send, from_worker_receive = anyio.create_memory_object_stream[bytes](math.inf)
    host = FakeHost(to_worker_send, from_worker_receive)
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            dispatcher.serve,
            MemoryByteReceiveStream(to_worker_receive),
            MemoryByteSendStream(from_worker_send),
        )
        try:
            yield host
        finally:
            await host.close()
            with anyio.fail_after(15):
                await _wait_served(dispatcher)
    to_worker_receive.close()
    from_worker_receive.close()
    from_worker_send.close()


async def _wait_served(dispatcher: Dispatcher) -> None:
    # serve() returns once the cleanup is done; the task group above waits for that.
    await dispatcher.stop()
