"""The attach relay: one PTY process ``/bin/bash -l`` in the sandbox, tied to the local terminal.

:func:`run_shell` (docs/protocol.md 8.1, "Connection ``createos_shell``"):

1. ``POST .../processes {"cmd": "/bin/bash", "args": ["-l"], "cwd": "/paperclip-workspace",
   "pty": {"rows", "cols"}}`` sized like the local terminal. The call is shielded and bounded, so a
   hang-up while it is in flight still learns the process id and deletes the process.
2. The local terminal goes raw (:func:`provider.shell.terminal.raw_mode`) and four tasks run:
   keystrokes are read as they come (``anyio.wait_readable``; a worker thread for a stdin the
   event loop cannot poll) into a small queue, and sent in batches of what is queued, at most
   :data:`~provider.createos.processes.MAX_INPUT_BYTES` per ``/input`` request, one request at a
   time: while one is in flight (or waits for the pacer) the next batch grows, so fast typing and
   pastes stay within the request budget; ``pty`` frames go to stdout as raw bytes
   (:func:`~provider.createos.stream.follow_process_output`, which reconnects from the last
   ``seq``); SIGWINCH sends ``/resize`` with the latest size (signals that arrive while a resize
   is in flight collapse into one).
3. The session ends at the exit frame (exit code; 1 for a signal), a local hang-up (EOF or EIO
   on stdin, SIGHUP, SIGTERM, SIGINT; a hung-up stdout), or a failure (the output stream could
   not be followed). On every way out the remote process is deleted (``DELETE ?grace_ms=1000``,
   under a shielded scope bounded to :data:`CLEANUP_SECONDS`), which also kills whatever the shell
   left running, and the terminal is restored before the last status line.

Every request takes its turn at the origin's shared pacer
(:func:`provider.createos.pacer.pacer_for`, the client's default). Status lines go to stderr and
never carry the API key (no message of :mod:`provider.createos` does).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Final

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from provider.createos.client import CreateOSClient
from provider.createos.errors import (
    APIConnectionError,
    AuthError,
    Conflict,
    CreateOSError,
    NotFound,
)
from provider.createos.models import ExitFrame
from provider.createos.processes import MAX_INPUT_BYTES
from provider.createos.stream import follow_process_output
from provider.shell.terminal import raw_mode, terminal_size, write_all, write_status

SHELL_CMD: Final = "/bin/bash"
SHELL_ARGS: Final = ("-l",)
SHELL_CWD: Final = "/paperclip-workspace"
DELETE_GRACE_MS: Final = 1000
CREATE_SECONDS: Final = 60.0
"""Bound of the (shielded) process creation."""
CLEANUP_SECONDS: Final = 10.0
"""Bound of the (shielded) process deletion on the way out."""
INPUT_GONE_SECONDS: Final = 5.0
"""After ``/input`` answers 404 or 409 (the shell is exiting), how long the exit frame may take."""
INPUT_QUEUE_CHUNKS: Final = 64
"""Local reads held while ``/input`` requests are in flight (then reading waits)."""
STREAM_RECONNECTS: Final = 10
"""Reconnects of the output stream over one session (an interactive shell lives long)."""
STREAM_RECONNECT_DELAY: Final = 0.5
HANGUP_SIGNALS: Final = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)
EXIT_FAILURE: Final = 1


@dataclass(frozen=True)
class Ended:
    """How the session ended: the exit code of this helper and the status line's text."""

    code: int
    reason: str


def exit_code_of(frame: ExitFrame) -> int:
    """The remote shell's exit code as ours: 1 for a signal (or a code outside 0..255)."""
    code = frame.exit_code
    if frame.signal is not None or code is None or not 0 <= code <= 255:
        return EXIT_FAILURE
    return code


def _exit_reason(frame: ExitFrame) -> str:
    if frame.signal is not None:
        return f"the remote shell was ended by {frame.signal}"
    return f"the remote shell exited with code {frame.exit_code}"


def _signal_hangup(signum: int) -> Ended:
    name = signal.Signals(signum).name
    return Ended(128 + signum, f"{name} received: the remote shell was closed")


class _Relay:
    """One attached session (see the module docstring); :meth:`run` answers the exit code."""

    def __init__(
        self,
        client: CreateOSClient,
        sandbox_id: str,
        *,
        stdin_fd: int,
        stdout_fd: int,
        status: Callable[[str], None],
    ) -> None:
        self._client = client
        self._sandbox_id = sandbox_id
        self._stdin = stdin_fd
        self._stdout = stdout_fd
        self._status = status
        self._ended: Ended | None = None
        self._relay_scope: anyio.CancelScope | None = None
        self._winch = anyio.Event()
        self._at_line_start = True
        self._warned_resize = False

    # -- outcome ---------------------------------------------------------------------------

    def _end(self, ended: Ended) -> None:
        """Record the first outcome and stop the relay tasks."""
        if self._ended is None:
            self._ended = ended
        if self._relay_scope is not None:
            self._relay_scope.cancel()

    async def run(self) -> int:
        with anyio.open_signal_receiver(signal.SIGWINCH, *HANGUP_SIGNALS) as signals:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_signals, signals)
                code = await self._session()
                tg.cancel_scope.cancel()
        return code

    async def _watch_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if signum == signal.SIGWINCH:
                self._winch.set()
            else:
                self._end(_signal_hangup(signum))

    async def _session(self) -> int:
        size = terminal_size(self._stdin, self._stdout)
        process_id = await self._create(size)
        if process_id is None:
            return EXIT_FAILURE
        try:
            if self._ended is None:
                self._say(
                    f"connected to sandbox {self._sandbox_id} (process {process_id}, "
                    f"{size[0]}x{size[1]}); exit the shell to disconnect."
                )
                with raw_mode(self._stdin):
                    await self._relay(process_id, size)
        finally:
            await self._delete(process_id)
        ended = self._ended or Ended(EXIT_FAILURE, "the session ended unexpectedly")
        self._say(f"disconnected: {ended.reason}.")
        return ended.code

    def _say(self, message: str) -> None:
        """A status line, on a fresh line when the remote output left the cursor mid-line."""
        self._status(message if self._at_line_start else "\n" + message)
        self._at_line_start = True

    # -- create and delete -----------------------------------------------------------------

    async def _create(self, size: tuple[int, int]) -> str | None:
        """Start the shell; None (with a status line) when it could not be started."""
        error: CreateOSError | None = None
        with anyio.CancelScope(shield=True):
            try:
                with anyio.fail_after(CREATE_SECONDS):
                    view = await self._client.create_process(
                        self._sandbox_id, cmd=SHELL_CMD, args=SHELL_ARGS, cwd=SHELL_CWD, pty=size
                    )
            except CreateOSError as exc:
                error = exc
            except TimeoutError:
                error = APIConnectionError("start process", "CreateOS start process timed out.")
        if error is None:
            return view.process_id
        self._say(f"could not open a shell: {error}{_create_hint(error, self._sandbox_id)}")
        return None

    async def _delete(self, process_id: str) -> None:
        """``DELETE ?grace_ms=1000``, shielded and bounded; failures are reported, not raised."""
        problem: str | None = None
        with anyio.move_on_after(CLEANUP_SECONDS, shield=True) as scope:
            try:
                await self._client.delete_process(
                    self._sandbox_id, process_id, grace_ms=DELETE_GRACE_MS
                )
            except NotFound:
                pass  # already gone
            except CreateOSError as exc:
                problem = str(exc)
        if scope.cancelled_caught:
            problem = f"no answer within {CLEANUP_SECONDS:g} s"
        if problem is not None:
            self._say(f"the remote shell (process {process_id}) may still be running: {problem}")

    # -- the relay -------------------------------------------------------------------------

    async def _relay(self, process_id: str, size: tuple[int, int]) -> None:
        send, receive = anyio.create_memory_object_stream[bytes](INPUT_QUEUE_CHUNKS)
        async with anyio.create_task_group() as tg:
            self._relay_scope = tg.cancel_scope
            if self._ended is not None:  # a hang-up came before the relay started
                tg.cancel_scope.cancel()
            tg.start_soon(self._read_keys, send)
            tg.start_soon(self._send_keys, process_id, receive)
            tg.start_soon(self._follow_output, process_id)
            tg.start_soon(self._resize, process_id, size)
        self._relay_scope = None

    async def _read_keys(self, send: MemoryObjectSendStream[bytes]) -> None:
        """Local keystrokes (whatever is available, up to one request's worth) into the queue;
        EOF or EIO is a hang-up."""
        pollable = True
        async with send:
            while True:
                if pollable:
                    try:
                        await anyio.wait_readable(self._stdin)
                    except OSError:  # a regular file or /dev/null cannot be polled
                        pollable = False
                        continue
                    data = _read(self._stdin)
                else:
                    data = await anyio.to_thread.run_sync(
                        _read, self._stdin, abandon_on_cancel=True
                    )
                if data is None:
                    continue
                if not data:
                    self._end(Ended(EXIT_FAILURE, "end of local input"))
                    return
                await send.send(data)

    async def _send_keys(self, process_id: str, receive: MemoryObjectReceiveStream[bytes]) -> None:
        """One ``/input`` request at a time, each carrying everything queued (≤ 256 KiB)."""
        carry: bytes | None = None
        async with receive:
            while True:
                batch = bytearray(carry if carry is not None else await receive.receive())
                carry = None
                while len(batch) < MAX_INPUT_BYTES:
                    try:
                        more = receive.receive_nowait()
                    except anyio.WouldBlock:
                        break
                    if len(batch) + len(more) > MAX_INPUT_BYTES:
                        carry = more
                        break
                    batch += more
                try:
                    await self._client.write_input(self._sandbox_id, process_id, bytes(batch))
                except CreateOSError as exc:
                    if isinstance(exc, NotFound) or (
                        isinstance(exc, Conflict) and await self._exited(process_id)
                    ):
                        # The shell is exiting: its exit frame is due on the output stream.
                        await anyio.sleep(INPUT_GONE_SECONDS)
                        self._end(Ended(EXIT_FAILURE, "the remote shell stopped taking input"))
                        return
                    self._say(f"keystrokes were lost: {exc}")

    async def _exited(self, process_id: str) -> bool:
        """After a 409 from ``/input``: has the shell exited (rather than fallen behind on its
        input)? A process the API no longer knows has."""
        try:
            view = await self._client.get_process(self._sandbox_id, process_id)
        except NotFound:
            return True
        except CreateOSError:
            return False
        return view.leader_exited or view.state == "exited" or view.exit_code is not None

    async def _follow_output(self, process_id: str) -> None:
        frames = follow_process_output(
            self._client,
            self._sandbox_id,
            process_id,
            max_reconnects=STREAM_RECONNECTS,
            reconnect_delay=STREAM_RECONNECT_DELAY,
        )
        try:
            async with contextlib.aclosing(frames):
                async for frame in frames:
                    if isinstance(frame, ExitFrame):
                        self._end(Ended(exit_code_of(frame), _exit_reason(frame)))
                        return
                    if frame.stream == "pty" and frame.data:
                        await self._write_output(frame.data)
        except CreateOSError as exc:
            self._end(Ended(EXIT_FAILURE, f"the output stream failed: {exc}"))
        except OSError:
            self._end(Ended(EXIT_FAILURE, "the local terminal was closed"))

    async def _write_output(self, data: bytes) -> None:
        await anyio.to_thread.run_sync(write_all, self._stdout, data, abandon_on_cancel=True)
        self._at_line_start = data.endswith(b"\n")

    async def _resize(self, process_id: str, size: tuple[int, int]) -> None:
        """On SIGWINCH, ``/resize`` to the latest local size (when it changed)."""
        last = size
        while True:
            await self._winch.wait()
            self._winch = anyio.Event()
            current = terminal_size(self._stdin, self._stdout)
            if current == last:
                continue
            rows, cols = current
            try:
                await self._client.resize_process(
                    self._sandbox_id, process_id, rows=rows, cols=cols
                )
            except (NotFound, Conflict):
                continue  # the shell is exiting
            except CreateOSError as exc:
                if not self._warned_resize:
                    self._warned_resize = True
                    self._say(f"the remote terminal was not resized: {exc}")
                continue
            last = current


def _read(fd: int) -> bytes | None:
    """What ``fd`` has (up to one request's worth); b"" at EOF or when it cannot be read (EIO
    after a hang-up); None when nothing was there after all."""
    try:
        return os.read(fd, MAX_INPUT_BYTES)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:  # EIO after a hang-up, EBADF for a closed stdin, ...
        return b""


def _create_hint(error: CreateOSError, sandbox_id: str) -> str:
    if isinstance(error, AuthError):
        return " (check CREATEOS_API_KEY: it must be the key that owns the sandbox)"
    if isinstance(error, NotFound):
        return f" (sandbox {sandbox_id} does not exist or belongs to another API key)"
    if isinstance(error, Conflict):
        return f" (sandbox {sandbox_id} is not running: resume it or start a new setup)"
    if isinstance(error, APIConnectionError):
        return " (if the request reached the API, the shell is deleted at capture or cancel)"
    return ""


async def run_shell(
    origin: str,
    api_key: str,
    sandbox_id: str,
    *,
    stdin_fd: int = 0,
    stdout_fd: int = 1,
    status: Callable[[str], None] = write_status,
) -> int:
    """Attach the local terminal to a new shell in ``sandbox_id`` until it ends; answers the
    exit code (see the module docstring). ``origin`` is normalized, ``sandbox_id`` valid."""
    async with CreateOSClient(origin, api_key) as client:
        relay = _Relay(client, sandbox_id, stdin_fd=stdin_fd, stdout_fd=stdout_fd, status=status)
        return await relay.run()
