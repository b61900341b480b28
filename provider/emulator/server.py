"""Emulator: the async context manager that runs the whole emulator inside the caller's loop."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from . import routes_exec, routes_processes, routes_sandboxes
from .admin import Admin
from .bwrap import check_reachable, probe_runtime
from .client import EmulatorAdmin
from .core import EmulatorCore
from .hostscan import scan_host
from .http import HTTPServer
from .images import ImageCatalog
from .router import Router, internal_error
from .usernet import find_slirp4netns, missing_warning

SUPERVISOR_SOURCE = Path(__file__).with_name("guest_supervisor.py")
# The supervisor's helper modules, copied next to it under their own names.
GUEST_HELPERS = (
    "guest_agent.py",
    "guest_channel.py",
    "guest_files.py",
    "guest_members.py",
    "guest_ops.py",
    "guest_trees.py",
)
TEMP_PREFIX = "createos-emulator-"
log = logging.getLogger("provider.emulator")
OWNER_FILE = "owner"


def owner_stamp(pid: int) -> str:
    """``pid starttime`` of a process (start time guards against pid reuse), or ''."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return ""
    return f"{pid} {int(raw[raw.rfind(b')') + 2 :].split()[19])}"


def remove_stale_temp_dirs() -> None:
    """Delete temp data dirs left by emulators that were killed before they could clean up."""
    for path in Path(tempfile.gettempdir()).glob(TEMP_PREFIX + "*"):
        try:
            stamp = (path / OWNER_FILE).read_text().split()
            alive = owner_stamp(int(stamp[0])) == " ".join(stamp)
        except (OSError, ValueError, IndexError):
            continue  # not ours, or still being set up: leave it
        if not alive:
            shutil.rmtree(path, ignore_errors=True)


class Emulator:
    """A loopback CreateOS emulator.

    ``async with Emulator(api_keys=["test-key"]) as emu:`` starts it (raising
    :class:`~provider.emulator.bwrap.BwrapUnavailable` when bubblewrap cannot sandbox here);
    leaving the block kills every sandbox process and removes the state it created.
    ``images`` maps extra rootfs names to local folders overlaid read-only in the sandboxes
    created with that ``rootfs`` (see :mod:`provider.emulator.images`); a bad name or folder
    raises :class:`~provider.emulator.images.ImageError` here, an unreachable one on start.
    """

    def __init__(
        self,
        api_keys: list[str] | tuple[str, ...] = ("test-key", "other-key"),
        data_dir: str | Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        settings: dict[str, Any] | None = None,
        *,
        admin_token: str | None = None,
        unshare_net: bool = False,
        access_log: bool = False,
        images: Mapping[str, Path | str] | None = None,
    ) -> None:
        self.images = ImageCatalog(images)
        self._api_keys = list(api_keys)
        self._data_dir_arg = Path(data_dir) if data_dir is not None else None
        self._host = host
        self._port = port
        self._settings = dict(settings or {})
        self.admin_token = admin_token or secrets.token_urlsafe(24)
        self._unshare_net = unshare_net
        self._access_log = access_log
        self._stack: contextlib.AsyncExitStack | None = None
        self._owned_dir: Path | None = None
        self.core: EmulatorCore | None = None
        self.base_url = ""
        self.admin = EmulatorAdmin("http://127.0.0.1", self.admin_token)

    async def __aenter__(self) -> Emulator:
        runtime = await anyio.to_thread.run_sync(probe_runtime)
        if not self._unshare_net and await anyio.to_thread.run_sync(find_slirp4netns) is None:
            log.warning("%s", missing_warning())
        data_dir = await anyio.to_thread.run_sync(self._prepare_data_dir)
        try:
            await anyio.to_thread.run_sync(check_reachable, data_dir, runtime)
            await anyio.to_thread.run_sync(self.images.check, runtime)
        except ValueError:
            await self._cleanup()
            raise
        core = EmulatorCore(
            api_keys=self._api_keys,
            data_dir=data_dir,
            runtime=runtime,
            supervisor=data_dir / "guest" / "supervisor.py",
            settings=self._settings,
            unshare_net=self._unshare_net,
            images=self.images,
        )
        router = Router(
            core,
            routes_sandboxes.ROUTES + routes_exec.ROUTES + routes_processes.ROUTES,
            Admin(core, self.admin_token),
            access_log=self._access_log,
        )
        server = HTTPServer(router, internal_error)
        host, port = server.bind(self._host, self._port)
        shown = f"[{host}]" if ":" in host else host
        self.base_url = f"http://{shown}:{port}"
        self.admin = EmulatorAdmin(self.base_url, self.admin_token)
        self.core = core
        stack = contextlib.AsyncExitStack()
        try:
            stack.push_async_callback(self._cleanup)
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.push_async_callback(core.shutdown)
            core.tg = tg
            tg.start_soon(server.serve)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        if self.core is not None and self.core.tg is not None:
            self.core.tg.cancel_scope.cancel()
        await stack.aclose()

    def _prepare_data_dir(self) -> Path:
        if self._data_dir_arg is None:
            remove_stale_temp_dirs()
            data_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
            self._owned_dir = data_dir
            (data_dir / OWNER_FILE).write_text(owner_stamp(os.getpid()))
        else:
            data_dir = self._data_dir_arg.resolve()
            data_dir.mkdir(parents=True, exist_ok=True)
        data_dir.chmod(0o711)
        guest = data_dir / "guest"
        guest.mkdir(exist_ok=True)
        guest.chmod(0o755)
        for source, name in [(SUPERVISOR_SOURCE, "supervisor.py")] + [
            (SUPERVISOR_SOURCE.with_name(helper), helper) for helper in GUEST_HELPERS
        ]:
            target = guest / name
            shutil.copyfile(source, target)
            target.chmod(0o644)
        sandboxes = data_dir / "sandboxes"
        sandboxes.mkdir(exist_ok=True)
        sandboxes.chmod(0o711)
        return data_dir

    async def _cleanup(self) -> None:
        owned = self._owned_dir
        if owned is not None:
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(owned, ignore_errors=True))
            self._owned_dir = None

    def leaked_host_pids(self) -> list[int]:
        """Host pids still alive in any PID namespace this emulator ever created, and every
        slirp4netns it started that still runs."""
        if self.core is None:
            return []
        found = scan_host(self.core.namespaces())
        helpers = [g.usernet.pid for g in self.core.guests if g.usernet and g.usernet.running]
        return sorted([p.host_pid for members in found.values() for p in members] + helpers)
