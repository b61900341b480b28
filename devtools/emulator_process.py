"""The CreateOS emulator as its own process (``python -m provider.emulator``).

Used where the emulator must be a separate process reached over loopback like a real CreateOS
endpoint: the e2e smoke (the full Paperclip server talks to it) and the benchmarks (so the
emulator's CPU is not the measured process's). The admin API (``/_emulator/``) gives the request
log and the state view; ``stop`` checks that no process of the emulator outlived it.
"""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import anyio
import anyio.abc

from devtools.e2e_server import REPO_ROOT, descendants
from devtools.procfs import wait_until_gone
from provider.emulator.client import EmulatorAdmin


class EmulatorProcess:
    """``async with EmulatorProcess(data_dir, api_key) as emu``: ``emu.base_url``, ``emu.admin``.

    ``images`` maps extra rootfs names to local folders (``--image NAME=DIR``), overlaid
    read-only in the sandboxes created with that ``rootfs``.
    """

    def __init__(
        self, data_dir: Path, api_key: str, images: Mapping[str, Path] | None = None
    ) -> None:
        self.data_dir = data_dir
        self.api_key = api_key
        self.images = {name: Path(folder).resolve() for name, folder in (images or {}).items()}
        self.log_path = data_dir.parent / "emulator.log"
        self.base_url = ""
        self.pid: int | None = None
        self.leftover_pids: list[int] = []
        self._token = secrets.token_urlsafe(16)
        self._process: anyio.abc.Process | None = None
        self._log: IO[bytes] | None = None

    @property
    def admin(self) -> EmulatorAdmin:
        return EmulatorAdmin(self.base_url, self._token)

    async def __aenter__(self) -> Self:
        argv = [sys.executable, "-m", "provider.emulator", "--host", "127.0.0.1", "--port", "0"]
        # NAME=VALUE: a token_urlsafe value may start with "-", which argparse would take
        # for an option (1 run in 64 failed to start the emulator).
        argv += [f"--api-key={self.api_key}", f"--admin-token={self._token}"]
        argv += ["--data-dir", str(self.data_dir)]
        for name, folder in self.images.items():
            argv += ["--image", f"{name}={folder}"]
        self._log = self.log_path.open("wb")
        process = await anyio.open_process(
            argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        self._process = process
        self.pid = process.pid
        try:
            assert process.stdout is not None
            line = b""
            with anyio.fail_after(60):
                while not line.endswith(b"\n"):
                    try:
                        line += await process.stdout.receive(1)
                    except anyio.EndOfStream:
                        tail = self.log_path.read_text("utf-8", "replace")[-2000:]
                        raise RuntimeError(f"the emulator exited before serving:\n{tail}") from None
            self.base_url = line.decode().strip()
            if not self.base_url.startswith("http://127.0.0.1:"):
                raise RuntimeError(f"the emulator printed {self.base_url!r} instead of its URL")
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with anyio.CancelScope(shield=True):
            await self.stop()

    async def stop(self) -> None:
        """SIGTERM (the emulator kills its sandboxes and exits); SIGKILL after 30 s."""
        process, self._process = self._process, None
        if process is not None:
            ours = [process.pid, *descendants(process.pid)]
            with anyio.move_on_after(45):
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                    with anyio.move_on_after(30):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
                await process.aclose()
            for pid in ours:
                if not await wait_until_gone(pid, 10.0):
                    self.leftover_pids.append(pid)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text("utf-8", "replace")
        except OSError:
            return ""
