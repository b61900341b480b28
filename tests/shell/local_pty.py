"""The attach helper on a real pseudo-terminal: the test holds the master side, as a terminal
emulator would, and the helper runs as the session leader with the slave as its controlling
terminal (so closing the master hangs it up and TIOCSWINSZ reaches it as SIGWINCH)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

REPO = Path(__file__).resolve().parents[2]

# Runs in the child: it is a new session's leader (start_new_session), so it may take the
# slave on fd 0 as its controlling terminal, then becomes the helper (same pid).
_CTTY_EXEC = (
    "import fcntl, os, sys, termios\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def helper_env(tmp_path: Path, key: str | None, **extra: str) -> dict[str, str]:
    """The operator's environment: the key (or none), a private pacer folder, no stray
    CreateOS variables from the machine running the tests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CREATEOS_", "PAPERCLIP_"))}
    env["PAPERCLIP_CREATEOS_RUNTIME_DIR"] = str(tmp_path / "runtime")
    env["TERM"] = "xterm-256color"
    if key is not None:
        env["CREATEOS_API_KEY"] = key
    env.update(extra)
    return env


def run_helper(
    args: Sequence[str], env: Mapping[str, str], *, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    """``python -m provider shell ARGS`` without a terminal (stdin at EOF), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "provider", "shell", *args],
        cwd=REPO,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
    )


class LocalTerminal:
    """One helper process on a pty of a given size; :attr:`output` is everything it showed."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], rows: int, cols: int) -> None:
        self.master, self.slave = os.openpty()
        set_size(self.slave, rows, cols)
        self.cooked = termios.tcgetattr(self.slave)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CTTY_EXEC, "-m", "provider", "shell", *args],
            cwd=REPO,
            env=dict(env),
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            start_new_session=True,
        )
        self.output = bytearray()
        self._changed = anyio.Event()
        self._pump_scope: anyio.CancelScope | None = None
        self.master_open = True

    async def pump(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        with anyio.CancelScope() as scope:
            self._pump_scope = scope
            task_status.started()
            while True:
                await anyio.wait_readable(self.master)
                if not self._read_once():
                    return

    def _read_once(self) -> bool:
        """One read of the master into :attr:`output`; False at its end."""
        try:
            chunk = os.read(self.master, 65536)
        except OSError:
            return False
        if not chunk:
            return False
        self.output += chunk
        self._changed.set()
        self._changed = anyio.Event()
        return True

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    async def expect(self, pattern: bytes, since: int = 0, timeout: float = 30) -> int:
        """Wait until ``pattern`` (a regex) shows after ``since``; answers where it ends."""
        regex = re.compile(pattern)
        try:
            with anyio.fail_after(timeout):
                while True:
                    found = regex.search(self.output, since)
                    if found is not None:
                        return found.end()
                    await self._changed.wait()
        except TimeoutError:
            pytest.fail(f"{pattern!r} never showed on the terminal; it shows {self.text!r}")

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def resize(self, rows: int, cols: int) -> None:
        """What a terminal emulator does when its window changes: TIOCSWINSZ (the kernel then
        signals the foreground group) and, to be sure, SIGWINCH to the helper."""
        set_size(self.master, rows, cols)
        os.kill(self.proc.pid, signal.SIGWINCH)

    def hang_up(self) -> None:
        """Close the terminal window: the master goes away."""
        if self._pump_scope is not None:
            self._pump_scope.cancel()
        if self.master_open:
            self.master_open = False
            os.close(self.master)

    def attrs(self) -> list[Any]:
        return termios.tcgetattr(self.slave)

    async def wait(self, timeout: float = 30) -> int:
        with anyio.fail_after(timeout):
            while (code := self.proc.poll()) is None:
                await anyio.sleep(0.02)
        # The helper has exited, so all it wrote is in the pty: read what the pump has not.
        while self.master_open and select.select([self.master], [], [], 0)[0]:
            if not self._read_once():
                break
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.hang_up()
        with contextlib.suppress(OSError):
            os.close(self.slave)


@asynccontextmanager
async def local_terminal(
    args: Sequence[str], env: Mapping[str, str], *, rows: int, cols: int
) -> AsyncIterator[LocalTerminal]:
    term = LocalTerminal(args, env, rows, cols)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(term.pump)
            try:
                yield term
            finally:
                tg.cancel_scope.cancel()
    finally:
        term.close()
