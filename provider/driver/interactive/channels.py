"""Duplex channels (``duplexChannel*``, docs/protocol.md 7): a byte pipe to a process in the
sandbox, which the host uses for its agent callback bridge (HTTP/2 over the channel).

The host's argv runs under a non-login ``bash -c`` (which prints nothing of its own) behind a
one-byte start gate read from the process's stdin, so nothing the child prints can be lost
before the output stream is attached; the stdin then stays open for the host's writes. Stdout
goes to the host raw, as padded base64 chunks of at most 196,608 bytes; stderr never mixes with
it (it would corrupt the framing) and goes to ``log`` lines instead, bounded per channel.

Requests: an open is 3 (create, connect, the gate's ``/input``), a write 1 ``/input`` (writes
queued behind one in flight share the next), a close 2 (``stdin/close``, then one confirmed
DELETE; none when the child already ended), a stop 1. The gate is the one request that could go,
and stays: the journal replays from ``after=0``, but only its last ~1 MiB, and a child that
prints from its first instant (``exec yes``) overruns that within the round trip before the
connect, which then answers 410 and the open fails: output the gate would have kept.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

import anyio

from provider.createos.client import MAX_INPUT_BYTES
from provider.createos.errors import Conflict, MalformedFrame, NotFound
from provider.createos.models import DataFrame
from provider.driver.commands.command_size import check_script
from provider.driver.commands.output import StreamDecoder
from provider.driver.commands.sandbox_text import quote
from provider.driver.core.params import (
    ChannelOpenParams,
    ChannelPairParams,
    ChannelWriteParams,
    RouteCloseParams,
)
from provider.driver.interactive.hub import Interactive, OpenTarget
from provider.driver.interactive.sessions import OPEN_DEADLINE_CAP, RemoteSession, start_process
from provider.errors import InvalidParams, ProviderError, RequestRefused
from provider.replies import AfterReply

KIND: Final = "duplex channel"
DATA_CHUNK_BYTES: Final = 196_608  # base64 of it stays within 262,144 characters
MAX_ARGS: Final = 1000
MAX_WRITE_BYTES: Final = 8 * 1024 * 1024
MALFORMED_LIMIT: Final = 100
STDERR_LINE_CHARS: Final = 4000
STDERR_BUDGET: Final = 65_536
GATE: Final = b"g"
GATE_SLACK_SECONDS: Final = 20
GATE_SECONDS: Final = int(OPEN_DEADLINE_CAP) + GATE_SLACK_SECONDS


def check_command(command: list[str]) -> None:
    """Refuse a channel argv that cannot start: empty, NUL, too many elements, or a script past
    the one-argument bound (:mod:`provider.driver.commands.command_size`), before any request."""
    if not command:
        raise InvalidParams("duplexChannelOpen needs a non-empty command array.")
    if len(command) > MAX_ARGS:
        raise InvalidParams(f"A channel command has at most {MAX_ARGS} elements.")
    for index, arg in enumerate(command):
        if not arg:
            raise InvalidParams(f"command[{index}] is empty.")
        if "\0" in arg:
            raise InvalidParams(f"command[{index}] contains a NUL character.")
    check_script(
        channel_script(command, GATE_SECONDS),
        "The channel command",
        [(f"command[{index}]", arg) for index, arg in enumerate(command)],
        "Start a script synced into the sandbox instead.",
    )


def channel_script(command: list[str], gate_seconds: int) -> str:
    """Wait for the one gate byte (bash reads a pipe byte by byte, so nothing after it is
    consumed), then ``exec`` the argv verbatim with the rest of stdin."""
    return f"IFS= read -r -N 1 -t {gate_seconds} _ || exit 125\nexec -- " + " ".join(
        quote(arg) for arg in command
    )


def strict_base64(data: str) -> bytes:
    """Padded standard base64 and nothing else (no whitespace, no missing padding)."""
    try:
        return binascii.a2b_base64(data.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise InvalidParams("duplexChannelWrite data must be padded standard base64.") from exc


@dataclass(eq=False)
class _QueuedWrite:
    data: bytes
    sent: bool = False
    error: ProviderError | None = None


@dataclass(eq=False)
class DuplexSession(RemoteSession):
    stderr_decoder: StreamDecoder = field(default_factory=StreamDecoder)
    stderr_logged: int = 0
    stderr_dropped: int = 0
    malformed: int = 0
    queued: deque[_QueuedWrite] = field(default_factory=deque)

    async def send(self, data: bytes) -> None:
        """Write ``data`` to the child's stdin after every earlier write, answering once its
        last byte is accepted. Writes that queued up behind an ``/input`` in flight go out
        together in the next one (up to 256 KiB): the host sends an HTTP/2 response as several
        small writes at once, and each request costs a pacing token. A failed ``/input`` fails
        every write it carried and ends the channel (the child's stream has a gap)."""
        item = _QueuedWrite(data)
        self.queued.append(item)  # before the lock: queue order is arrival order
        try:
            async with self.input_lock:
                if not item.sent:
                    await self._send_batch()
        except BaseException:
            if not item.sent and item in self.queued:
                self.queued.remove(item)  # a cancelled write never goes out later
            raise
        if item.error is not None:
            raise item.error

    async def _send_batch(self) -> None:
        batch = [self.queued.popleft()]
        size = len(batch[0].data)
        while self.queued and size + len(self.queued[0].data) <= MAX_INPUT_BYTES:
            size += len(self.queued[0].data)
            batch.append(self.queued.popleft())
        data = b"".join(item.data for item in batch)
        error: ProviderError | None = ProviderError(
            "The duplex channel write was cancelled part-way; the channel was ended."
        )
        try:
            if not self.live:
                error = RequestRefused("The duplex channel ended while the write waited.")
                return
            assert self.process_id is not None
            try:
                for start in range(0, len(data), MAX_INPUT_BYTES):
                    await self.client.write_input(
                        self.scope.lease_id, self.process_id, data[start : start + MAX_INPUT_BYTES]
                    )
                error = None
            except ProviderError as exc:
                error = exc
        finally:
            for item in batch:  # also when cancelled: no write of the batch waits forever
                item.sent, item.error = True, error
            if error is not None and not isinstance(error, RequestRefused):
                self.broken = True  # a gap in the stream the child reads cannot be repaired
                with anyio.CancelScope(shield=True):
                    await self.stop_quietly()

    async def on_open(self) -> None:
        assert self.process_id is not None
        await self.client.write_input(self.scope.lease_id, self.process_id, GATE)

    async def before_close(self) -> None:
        assert self.process_id is not None
        with contextlib.suppress(Conflict, NotFound, ProviderError):
            await self.client.close_stdin(self.scope.lease_id, self.process_id)

    async def forward(self, frame: DataFrame) -> None:
        if frame.stream == "stdout":
            data = frame.data
            for start in range(0, len(data), DATA_CHUNK_BYTES):
                chunk = data[start : start + DATA_CHUNK_BYTES]
                await self.notify(
                    "duplexChannel.data",
                    {
                        "hostRouteId": self.route_id,
                        "workerSessionId": self.session_id,
                        "chunk": base64.b64encode(chunk).decode("ascii"),
                    },
                )
        elif frame.stream == "stderr":
            await self._stderr(self.stderr_decoder.feed(frame.data))
        else:
            raise MalformedFrame("CreateOS sent terminal output for a duplex channel's process.")

    async def flush(self) -> None:
        await self._stderr(self.stderr_decoder.flush())
        if self.stderr_dropped:
            await self.log(
                "warn",
                f"{self.session_id} stderr: {self.stderr_dropped} more characters not shown.",
                None,
            )

    async def _stderr(self, text: str) -> None:
        room = STDERR_BUDGET - self.stderr_logged
        shown, self.stderr_dropped = text[:room], self.stderr_dropped + max(0, len(text) - room)
        for start in range(0, len(shown), STDERR_LINE_CHARS):
            piece = shown[start : start + STDERR_LINE_CHARS]
            self.stderr_logged += len(piece)
            await self.log("warn", f"{self.session_id} stderr: {piece}", None)

    async def send_exit(self) -> None:
        params: dict[str, Any] = {
            "hostRouteId": self.route_id,
            "workerSessionId": self.session_id,
            "exitCode": self.exit_code(),
        }
        if self.transport_closed:
            params["transportClosed"] = True
        await self.notify("duplexChannel.exit", params)


class DuplexChannels:
    """The four ``duplexChannel*`` verbs."""

    def __init__(self, interactive: Interactive) -> None:
        self.interactive = interactive

    async def open(self, p: ChannelOpenParams) -> AfterReply:
        check_command(p.command)
        target: OpenTarget = self.interactive.check_open(KIND, p, "duplexChannelOpen")
        session = self.interactive.new_session(DuplexSession, KIND, target, "duplex")
        script = channel_script(p.command, GATE_SECONDS)

        async def start(s: RemoteSession) -> None:
            await start_process(s, script=script, login=False, pty=None)
            self.interactive.start_reader(s, target.window)
            await s.wait_opened()  # connected and the gate written (7.1.3)

        table = self.interactive.table
        return await self.interactive.open(
            session,
            target,
            start,
            {"hostRouteId": p.hostRouteId, "workerSessionId": session.session_id},
            on_bound=lambda: table.remember_bound(p.hostRouteId, session.session_id),
        )

    def _pair(self, p: ChannelPairParams) -> DuplexSession | None:
        session = self.interactive.table.by_route(KIND, p.hostRouteId)
        if session is None or session.session_id != p.workerSessionId:
            return None
        assert isinstance(session, DuplexSession)
        return session

    async def write(self, p: ChannelWriteParams) -> None:
        session = self._pair(p)
        if session is None or not session.live:
            raise RequestRefused("No open duplex channel has this hostRouteId and session id.")
        if not p.data:
            return None
        try:
            data = strict_base64(p.data)
        except InvalidParams:
            session.malformed += 1
            if session.malformed >= MALFORMED_LIMIT:
                await session.stop_quietly()
                raise InvalidParams(
                    f"duplexChannelWrite data must be padded standard base64; after "
                    f"{MALFORMED_LIMIT} malformed writes the channel was stopped."
                ) from None
            raise
        if len(data) > MAX_WRITE_BYTES:
            raise InvalidParams("A duplexChannelWrite is limited to 8 MiB of data.")
        await session.send(data)
        return None

    async def stop(self, p: ChannelPairParams) -> None:
        session = self._pair(p)
        if session is not None and not session.opening:
            await session.stop()
        return None

    async def close(self, p: RouteCloseParams) -> dict[str, Any]:
        session = self.interactive.table.by_route(KIND, p.hostRouteId)
        if session is not None:
            await self.interactive.close(session)
        bound = self.interactive.table.bound_session(p.hostRouteId)
        if bound is None:
            return {"hostRouteId": p.hostRouteId}
        return {"hostRouteId": p.hostRouteId, "workerSessionId": bound}
