"""Managed-process calls of the CreateOS client: start, read, kill, stdin, resize and the output
stream.

docs/protocol.md C6 (``/sandboxes/{id}/processes``). Starting a process and writing its input
are POSTs, repeated only on 429 and 503 (a lost answer may already have started it or delivered the
bytes). The output stream (:meth:`ProcessCalls.connect`) is never retried here: its reader,
:func:`provider.createos.stream.follow_process_output`, reconnects with ``after=``.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

from provider.createos.core import STREAM_READ_TIMEOUT, ClientCore, stream_timeout
from provider.createos.errors import APIProtocolError
from provider.createos.models import ProcessView, process_view, require_id
from provider.createos.wire import Wire

MAX_INPUT_BYTES: Final = 256 * 1024  # decoded bytes per /input request
MAX_PTY_SIDE: Final = 1000  # rows and cols of a PTY: integers 1 to this (docs/protocol.md C8.6)
SIGNALS: Final = (
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGKILL",
    "SIGTERM",
    "SIGUSR1",
    "SIGUSR2",
    "SIGWINCH",
)


class ProcessCalls(ClientCore):
    """``/sandboxes/{id}/processes`` and ``.../processes/{pid}`` (and its stdin and output)."""

    async def create_process(
        self,
        sandbox_id: str,
        *,
        cmd: str,
        args: Sequence[str],
        cwd: str | None = None,
        pty: tuple[int, int] | None = None,
        wire: Wire | None = None,
    ) -> ProcessView:
        """``POST .../processes``. Repeated only on 429 and 503; any other failure is raised
        once. ``wire`` tells whether the request was sent (:class:`~provider.createos.wire.Wire`).

        ``pty`` = (rows, cols) gives the process a terminal of that size: its output then
        arrives as ``pty`` frames only, and ``/input`` is typed into the terminal."""
        operation = "start process"
        require_id(sandbox_id, "sandbox")
        body: dict[str, Any] = {"cmd": cmd, "args": list(args)}
        if cwd is not None:
            body["cwd"] = cwd
        if pty is not None:
            rows, cols = pty
            body["pty"] = {"rows": rows, "cols": cols}
        data = await self._json_call(
            "POST", f"/sandboxes/{sandbox_id}/processes", operation=operation, json=body, wire=wire
        )
        return process_view(data, operation)

    async def list_processes(self, sandbox_id: str) -> list[ProcessView]:
        """``GET .../processes``: every managed process the sandbox still lists."""
        operation = "list processes"
        require_id(sandbox_id, "sandbox")
        data = await self._json_call(
            "GET", f"/sandboxes/{sandbox_id}/processes", operation=operation
        )
        items = data.get("processes") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise APIProtocolError(f"CreateOS {operation} answered without a process list.")
        return [process_view(item, operation) for item in items]

    async def get_process(self, sandbox_id: str, process_id: str) -> ProcessView:
        """``GET .../processes/{pid}``."""
        operation = "read process"
        url = self._process_url(sandbox_id, process_id)
        view = process_view(await self._json_call("GET", url, operation=operation), operation)
        if view.process_id != process_id:
            raise APIProtocolError(f"CreateOS {operation} answered for another process.")
        return view

    async def delete_process(
        self, sandbox_id: str, process_id: str, *, grace_ms: int = 1000
    ) -> ProcessView:
        """``DELETE .../processes/{pid}?grace_ms=``: kills the tree; answers once it is gone."""
        operation = "kill process"
        if isinstance(grace_ms, bool) or not isinstance(grace_ms, int) or grace_ms < 0:
            raise ValueError("grace_ms must be a non-negative integer")
        url = self._process_url(sandbox_id, process_id)
        data = await self._json_call(
            "DELETE", url, operation=operation, params={"grace_ms": grace_ms}
        )
        return process_view(data, operation)

    async def signal_process(self, sandbox_id: str, process_id: str, signal: str) -> None:
        """``POST .../processes/{pid}/signal``: the process group (the foreground group of a
        PTY). ``signal`` is a ``SIG*`` name the API allows (``SIGTERM``, ``SIGINT``, ...)."""
        if signal not in SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(SIGNALS)}")
        url = self._process_url(sandbox_id, process_id) + "/signal"
        await self._json_call("POST", url, operation="signal process", json={"signal": signal})

    async def close_stdin(self, sandbox_id: str, process_id: str) -> None:
        """``POST .../processes/{pid}/stdin/close``; 409 (already closed) raises Conflict."""
        url = self._process_url(sandbox_id, process_id) + "/stdin/close"
        await self._json_call("POST", url, operation="close process stdin")

    async def write_input(self, sandbox_id: str, process_id: str, data: bytes) -> None:
        """``POST .../processes/{pid}/input``: ``data`` (at most :data:`MAX_INPUT_BYTES`) goes
        to the process's stdin. Repeated only on 429 and 503 (a lost answer may have delivered
        it)."""
        if len(data) > MAX_INPUT_BYTES:
            raise ValueError(f"input is limited to {MAX_INPUT_BYTES} bytes per request")
        url = self._process_url(sandbox_id, process_id) + "/input"
        body = {"data_base64": base64.b64encode(data).decode("ascii")}
        await self._json_call("POST", url, operation="write process input", json=body)

    async def resize_process(
        self, sandbox_id: str, process_id: str, *, rows: int, cols: int
    ) -> None:
        """``POST .../processes/{pid}/resize {"rows", "cols"}``: the terminal of a PTY process
        takes that size (its foreground job gets SIGWINCH). Each side is an integer from 1 to
        :data:`MAX_PTY_SIDE`; a pipe process answers 409 (Conflict)."""
        for name, value in (("rows", rows), ("cols", cols)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer")
            if not 1 <= value <= MAX_PTY_SIDE:
                raise ValueError(f"{name} must be from 1 to {MAX_PTY_SIDE}")
        url = self._process_url(sandbox_id, process_id) + "/resize"
        body = {"rows": rows, "cols": cols}
        await self._json_call("POST", url, operation="resize process", json=body)

    def connect(
        self,
        sandbox_id: str,
        process_id: str,
        *,
        after: int,
        read_timeout: float = STREAM_READ_TIMEOUT,
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """``GET .../connect?after=N`` as raw NDJSON body chunks (not retried).

        Status errors are raised on enter (410 -> OutputEvicted); transport errors while
        reading become APIConnectionError (APITimeout after ``read_timeout`` seconds without a
        byte).
        """
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError("after must be a non-negative integer")
        url = self._process_url(sandbox_id, process_id) + "/connect"
        return self._stream(
            url,
            operation="follow process output",
            accept="application/x-ndjson",
            params={"after": after},
            limits=stream_timeout(read_timeout),
        )

    @staticmethod
    def _process_url(sandbox_id: str, process_id: str) -> str:
        require_id(sandbox_id, "sandbox")
        require_id(process_id, "process")
        return f"/sandboxes/{sandbox_id}/processes/{process_id}"
