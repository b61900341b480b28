"""Spacing of request starts per API origin, in this process and across processes on this host.

CreateOS allows 300 requests per minute per caller IP, so every request start (control calls,
retries, stream opens) first awaits :meth:`RequestPacer.wait_turn`, which keeps starts to one
origin at least ``interval`` seconds apart (default 300 ms, at most 200 per minute).

How a turn works:

1. **Reserve** a slot ``max(now, last reserved + interval, last start + interval)``. Slots are
   handed out in call order, so waiters are served FIFO. A waiter cancelled later keeps its slot
   ("its turn still counts"), so the waiters behind it keep their spacing.
2. **Sleep** until the slot (cancellable: a cancelled waiter leaves at once).
3. **Claim** the start: if ``now >= last start + interval`` record ``now`` as the last start and
   return; otherwise sleep until then and claim again. Spacing is therefore measured between
   actual starts, even when a waiter wakes late.

With a ``shared_dir`` both values live in a small file per origin (named by the sha256 of the
origin) that every worker process on the host updates under an ``fcntl.flock``. The lock is
only ever taken non-blocking (``LOCK_NB``) for a read-modify-write of a few bytes; a busy lock
is retried after a 1 ms sleep, so the event loop never blocks. Times are ``time.monotonic()``
(CLOCK_MONOTONIC, system-wide on Linux), tagged with the kernel boot id so a record from
before a reboot is ignored. If the file cannot be used the pacer falls back to in-process
spacing and logs one warning.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import os
import stat
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import EllipsisType
from typing import Final, TypeVar
from urllib.parse import urlsplit

import anyio
import anyio.lowlevel

__all__ = [
    "DEFAULT_INTERVAL",
    "ENV_INTERVAL_MS",
    "ENV_RUNTIME_DIR",
    "RequestPacer",
    "default_runtime_dir",
    "normalize_origin",
    "pacer_for",
]

DEFAULT_INTERVAL: Final = 0.3
ENV_INTERVAL_MS: Final = "PAPERCLIP_CREATEOS_PACE_MS"
"""Overrides the interval of :func:`pacer_for` pacers, in milliseconds (tests, demos)."""
ENV_RUNTIME_DIR: Final = "PAPERCLIP_CREATEOS_RUNTIME_DIR"
"""Overrides the runtime folder that holds the shared per-origin pacing files."""

_LOCK_RETRY: Final = 0.001
_MAX_AHEAD: Final = 3600.0  # a stored time this far in the future is stale, not a queue
_RECORD_SIZE: Final = 128

log = logging.getLogger(__name__)

R = TypeVar("R")
Step = Callable[[float, float], tuple[float, float, R]]
"""A read-modify-write of (last reserved slot, last start) -> (new values, result)."""


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` in lower case, default port dropped, no trailing slash."""
    text = origin.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return text.rstrip("/").lower()
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if not scheme or not host:
        return text.rstrip("/").lower()
    if ":" in host:
        host = f"[{host}]"
    if port is None or port == {"https": 443, "http": 80}.get(scheme):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def default_runtime_dir() -> Path:
    """``$PAPERCLIP_CREATEOS_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/paperclip-createos``, else
    ``<tmp>/paperclip-createos-<uid>``."""
    override = os.environ.get(ENV_RUNTIME_DIR, "").strip()
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if xdg and Path(xdg).is_absolute() and Path(xdg).is_dir():
        return Path(xdg) / "paperclip-createos"
    return Path(tempfile.gettempdir()) / f"paperclip-createos-{os.getuid()}"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or "unknown"
    except OSError:
        return "unknown"


class _LocalBook:
    """The two pacing times of one origin, in this process only."""

    def __init__(self) -> None:
        self.reserved = -math.inf
        self.last_start = -math.inf

    def transact(self, step: Step[R]) -> tuple[bool, R | None]:
        self.reserved, self.last_start, result = step(self.reserved, self.last_start)
        return True, result


class _FileBook(_LocalBook):
    """The pacing times in a per-origin file shared by every process of this user.

    The in-process values are kept as a floor, so a file that gets reset or removed can never
    make this process pace faster than it would alone.
    """

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._fd: int | None = None
        self._boot = _boot_id()

    def _open(self) -> int:
        if self._fd is None:
            folder = self.path.parent
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.lstat(folder)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
                raise PermissionError("pacing folder is not a private directory of this user")
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.path, flags, 0o600)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                os.close(fd)
                raise PermissionError("pacing file is not a regular file of this user")
            self._fd = fd
        return self._fd

    def _read(self, fd: int, now: float) -> tuple[float, float]:
        fields = os.pread(fd, _RECORD_SIZE, 0).split()
        if len(fields) != 3 or fields[0].decode("ascii", "replace") != self._boot:
            return -math.inf, -math.inf
        try:
            reserved, last_start = float(fields[1]), float(fields[2])
        except ValueError:
            return -math.inf, -math.inf
        if not (reserved <= now + _MAX_AHEAD and last_start <= now + _MAX_AHEAD):
            return -math.inf, -math.inf  # NaN or a value that cannot come from this boot
        return reserved, last_start

    def transact(self, step: Step[R]) -> tuple[bool, R | None]:
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False, None
        try:
            reserved, last_start = self._read(fd, time.monotonic())
            reserved = max(reserved, self.reserved)
            last_start = max(last_start, self.last_start)
            self.reserved, self.last_start, result = step(reserved, last_start)
            record = f"{self._boot} {self.reserved!r} {self.last_start!r}\n".encode()
            os.pwrite(fd, record.ljust(_RECORD_SIZE), 0)
            return True, result
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class RequestPacer:
    """Spacing of request starts for one API origin (see the module docstring).

    ``interval <= 0`` disables pacing. ``shared_dir=...`` (the default) shares the spacing
    with other processes through :func:`default_runtime_dir`; ``None`` keeps it in-process;
    a path uses that folder (created with mode 0700 when missing).
    """

    def __init__(
        self,
        origin: str,
        *,
        interval: float = DEFAULT_INTERVAL,
        shared_dir: Path | EllipsisType | None = ...,
    ) -> None:
        self.origin = normalize_origin(origin)
        self.interval = interval
        self._book: _LocalBook = _LocalBook()
        if interval > 0 and shared_dir is not None:
            try:
                folder = default_runtime_dir() if shared_dir is ... else Path(shared_dir)
            except OSError:  # no usable temporary directory: pace in-process
                log.warning("CreateOS request pacing is per process: no runtime folder")
            else:
                digest = hashlib.sha256(self.origin.encode()).hexdigest()
                self._book = _FileBook(folder / f"{digest}.pace")
        self._reserving: deque[object] = deque()

    @property
    def shared_path(self) -> Path | None:
        """The shared pacing file, or None when spacing is in-process only."""
        return self._book.path if isinstance(self._book, _FileBook) else None

    async def wait_turn(self) -> None:
        """Return once this request may start. Cancellation leaves at once (and raises)."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self.interval <= 0:
            return
        slot = await self._transact(self._reserve_step, fifo=True)
        while True:
            delay = slot - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            retry_at = await self._transact(self._claim_step, fifo=False)
            if retry_at is None:
                return
            slot = retry_at

    def _reserve_step(self, reserved: float, last_start: float) -> tuple[float, float, float]:
        slot = max(time.monotonic(), reserved + self.interval, last_start + self.interval)
        return slot, last_start, slot

    def _claim_step(self, reserved: float, last_start: float) -> tuple[float, float, float | None]:
        now = time.monotonic()
        allowed = last_start + self.interval
        if now >= allowed:
            return max(reserved, now), now, None
        return reserved, last_start, allowed

    def _try(self, step: Step[R]) -> tuple[bool, R | None]:
        try:
            return self._book.transact(step)
        except OSError as exc:
            if not isinstance(self._book, _FileBook):
                raise
            log.warning(
                "CreateOS request pacing falls back to this process only: %s (%s)",
                type(exc).__name__,
                self._book.path.parent,
            )
            fallback = _LocalBook()
            fallback.reserved, fallback.last_start = self._book.reserved, self._book.last_start
            self._book.close()
            self._book = fallback
            return self._book.transact(step)

    async def _transact(self, step: Step[R], *, fifo: bool) -> R:
        if not (fifo and self._reserving):
            done, result = self._try(step)
            if done:
                return result  # type: ignore[return-value]
        # The shared lock is busy (another process is mid-update) or earlier waiters of this
        # process are already retrying: queue up behind them and poll.
        ticket = object()
        if fifo:
            self._reserving.append(ticket)
        try:
            while True:
                await anyio.sleep(_LOCK_RETRY)
                if fifo and self._reserving[0] is not ticket:
                    continue
                done, result = self._try(step)
                if done:
                    return result  # type: ignore[return-value]
        finally:
            if fifo:
                self._reserving.remove(ticket)


_registry: dict[str, RequestPacer] = {}
_registry_lock = threading.Lock()


def _env_interval() -> float:
    raw = os.environ.get(ENV_INTERVAL_MS, "").strip()
    if not raw:
        return DEFAULT_INTERVAL
    try:
        value = float(raw) / 1000
    except ValueError:
        return DEFAULT_INTERVAL
    return value if math.isfinite(value) and value >= 0 else DEFAULT_INTERVAL


def pacer_for(origin: str) -> RequestPacer:
    """The process-wide pacer of ``origin`` (300 ms, shared across processes by default)."""
    key = normalize_origin(origin)
    with _registry_lock:
        pacer = _registry.get(key)
        if pacer is None:
            pacer = RequestPacer(key, interval=_env_interval())
            _registry[key] = pacer
        return pacer
