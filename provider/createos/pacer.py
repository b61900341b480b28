"""A token bucket for request starts per API origin, shared by every worker process on the host.

CreateOS allows 300 requests per minute per caller IP. Every request start (control calls,
retries, cleanup, stream opens) first awaits :meth:`RequestPacer.wait_turn`, which takes one
token from the bucket of the request's normalized origin (docs/protocol.md 4):

* **capacity 40 tokens, refill one token per** ``interval`` (default 250 ms, 4 per second),
  starting full. A burst of up to 40 starts goes out without waiting (a lone agent heartbeat of
  a few dozen requests needs no waiting); an open stream holds no token.
* **Bound:** in any window of T seconds at most ``40 + T / interval`` starts reach one origin
  (40 + 4·T: at most 280 in any minute, leaving 20 of the 300 to other clients on the IP).
  Capacity and rate share that budget, ``capacity + 60 / interval <= 280``: the rate stays at
  4 per second (the sustained pace, which bounds how many heartbeats an IP completes a minute)
  and the rest of the minute's budget is the burst.
* A **429** (:meth:`RequestPacer.penalize`) empties the bucket for every worker and holds every
  start until ``Retry-After`` (at most :data:`MAX_HOLD`) has passed; the bucket refills from then.

**State.** One number per origin, ``full_at``: the time at which the bucket will be full again,
so ``tokens(now) = min(C, C - (full_at - now) / interval)`` with ``C = 40``. A start at ``now``
is allowed when ``now >= full_at - (C - 1) * interval`` (at least one token) and sets
``full_at = max(full_at, now) + interval``. A 429 sets
``full_at = max(full_at, now + hold + C * interval)``: empty at the end of the hold, so the
first start comes one interval after it and the bucket refills from zero (no burst right after a
hold: full again only ``C * interval`` = 10 s later).

**Why the bound holds.** Number the starts in the order they were granted (each grant is a
read-modify-write of ``full_at`` under one lock, reading the clock inside it, so grant times
``t1 <= t2 <= ...`` follow that order). Every grant raises ``full_at`` by at least ``interval``
and nothing lowers it (a 429 only raises it), so after grant k, ``full_at >= t1 + k * interval``.
Grant n needed ``tn >= full_at - (C - 1) * interval >= t1 + (n - 1) * interval - (C - 1) *
interval``, hence ``n <= C + (tn - t1) / interval``: a window of T seconds holds at most
``C + T / interval``. Only a record from another boot or a corrupt one is dropped (the process's
floor still holds).

**Restarts and fresh files.** A worker that restarts opens the same file and reads the state
its predecessors left, so a restart grants nothing the bound does not allow. A file with no
valid record (its first use since boot) starts full, C tokens: no worker of this boot has
spent from it. The file's state is lost only on a reboot (a new boot id) or if someone removes
the file while workers run; a reboot takes longer than ``C * interval`` (10 s), and starts on
both sides of a gap of at least that length stay within ``2C + (60 - 10) * 4 = 280`` a minute.

**Sharing.** With a ``shared_dir`` the value lives in a small file per origin (named by the
sha256 of the origin) that every worker process of this user on the host updates under an
``fcntl.flock``. The default folder (:func:`default_runtime_dir`) is one per account and machine,
not per Paperclip instance: every instance and tool of the account spends the one IP's budget.
The lock is only ever taken non-blocking (``LOCK_NB``) for a read-modify-write
of a few bytes; a busy lock is retried after a 1 ms sleep, so the event loop never blocks. Times
are ``time.monotonic()`` (CLOCK_MONOTONIC, system-wide on Linux), tagged with the kernel boot id
so a record from before a reboot is ignored, as is a record too far ahead to come from this
design. Each process keeps the last value it saw as a floor, so a removed or reset file never
lets it go faster than it would alone. If the file cannot be used the pacer falls back to an
in-process bucket (carrying its state over) and logs one warning.

**Waiting.** Waiters of one process are served FIFO: only the first in line polls the bucket,
sleeping until the time a token will be there; the others wait for their turn in line. A waiter
that is already cancelled leaves at once with its cancellation (taking no token); one cancelled
while queued leaves at once too, even behind a sleeping first waiter; a first waiter that leaves
by cancellation or any error hands the line to the next. A waiter only ever takes a token at the
moment it starts, so tokens a cancelled waiter did not take stay in the bucket. Across
processes the first waiters of each process compete for tokens (best effort, not FIFO); the
bound holds regardless.

``PAPERCLIP_CREATEOS_PACE_MS`` sets the refill interval of :func:`pacer_for` pacers (default
250; 0 disables pacing); the capacity stays 40. Unit tests may inject the clock (it must agree
with anyio's sleep, e.g. ``anyio.current_time`` under a virtual-time event loop).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from types import EllipsisType
from typing import Final, TypeVar
from urllib.parse import urlsplit

import anyio
import anyio.lowlevel

__all__ = [
    "CAPACITY",
    "DEFAULT_INTERVAL",
    "ENV_INTERVAL_MS",
    "ENV_RUNTIME_DIR",
    "MAX_HOLD",
    "RequestPacer",
    "default_runtime_dir",
    "normalize_origin",
    "pacer_for",
]

CAPACITY: Final = 40
"""Tokens in a full bucket: the largest burst of starts that goes out without waiting."""
DEFAULT_INTERVAL: Final = 0.25
"""Seconds per refilled token (4 per second)."""
MAX_HOLD: Final = 60.0
"""The longest ``Retry-After`` the bucket honours (the client does not wait for longer ones)."""
ENV_INTERVAL_MS: Final = "PAPERCLIP_CREATEOS_PACE_MS"
"""Overrides the refill interval of :func:`pacer_for` pacers, in milliseconds (tests, demos)."""
ENV_RUNTIME_DIR: Final = "PAPERCLIP_CREATEOS_RUNTIME_DIR"
"""Overrides the runtime folder that holds the shared per-origin pacing files."""

_LOCK_RETRY: Final = 0.001
_MIN_PAUSE: Final = 0.0001  # a wake-up a hair early must not spin
_RECORD_SIZE: Final = 128
_RECORD_TAG: Final = "tb1"  # token bucket, record version 1

log = logging.getLogger(__name__)

R = TypeVar("R")
Step = Callable[[float, float], tuple[float, R]]
"""A read-modify-write of the bucket: (full_at, now) -> (new full_at, result)."""
Clock = Callable[[], float]


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


def default_runtime_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$PAPERCLIP_CREATEOS_RUNTIME_DIR``, else ``/tmp/paperclip-createos-<uid>``: one folder
    per account and machine, whichever Paperclip instance or tool asks. ``TMPDIR`` and
    ``XDG_RUNTIME_DIR`` are ignored on purpose: the host gives its workers neither, and a tool
    run from a login shell that has them must still share the workers' budget."""
    env = os.environ if environ is None else environ
    override = env.get(ENV_RUNTIME_DIR, "").strip()
    if override:
        return Path(override)
    return Path("/tmp") / f"paperclip-createos-{os.getuid()}"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or "unknown"
    except OSError:
        return "unknown"


class _LocalBook:
    """The bucket of one origin, in this process only."""

    def __init__(self, clock: Clock) -> None:
        self.full_at = -math.inf
        self._clock = clock

    def transact(self, step: Step[R]) -> R | None:
        """Apply ``step``; None when the shared lock is busy (never for this class)."""
        self.full_at, result = step(self.full_at, self._clock())
        return result


class _FileBook(_LocalBook):
    """The bucket in a per-origin file shared by every process of this user.

    The in-process value is kept as a floor, so a file that gets reset or removed can never
    make this process start requests faster than it would alone.
    """

    def __init__(self, path: Path, clock: Clock, horizon: float) -> None:
        super().__init__(clock)
        self.path = path
        self._horizon = horizon  # a stored time further ahead than this is stale, not a queue
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

    def _read(self, fd: int, now: float) -> float:
        fields = os.pread(fd, _RECORD_SIZE, 0).split()
        if (
            len(fields) != 3
            or fields[0] != _RECORD_TAG.encode()
            or fields[1].decode("ascii", "replace") != self._boot
        ):
            return -math.inf
        try:
            full_at = float(fields[2])
        except ValueError:
            return -math.inf
        if not full_at <= now + self._horizon:
            return -math.inf  # NaN or a value that cannot come from this boot
        return full_at

    def transact(self, step: Step[R]) -> R | None:
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        try:
            now = self._clock()  # read under the lock: grant times follow the lock order
            stored = self._read(fd, now)
            full_at, result = step(max(stored, self.full_at), now)
            if full_at != stored:
                record = f"{_RECORD_TAG} {self._boot} {full_at!r}\n".encode()
                os.pwrite(fd, record.ljust(_RECORD_SIZE), 0)
            self.full_at = full_at
            return result
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class RequestPacer:
    """The token bucket of one API origin (see the module docstring).

    ``interval`` is the refill interval in seconds (``<= 0`` disables pacing).
    ``shared_dir=...`` (the default) shares the bucket with other processes through
    :func:`default_runtime_dir`; ``None`` keeps it in-process; a path uses that folder (created
    with mode 0700 when missing). ``clock`` is for unit tests; ``on_start`` is called with the
    clock time of every granted start (tests and benches).
    """

    capacity: Final = CAPACITY

    def __init__(
        self,
        origin: str,
        *,
        interval: float = DEFAULT_INTERVAL,
        shared_dir: Path | EllipsisType | None = ...,
        clock: Clock = time.monotonic,
        on_start: Callable[[float], object] | None = None,
    ) -> None:
        self.origin = normalize_origin(origin)
        self.interval = interval
        self._clock = clock
        self._on_start = on_start
        self._book: _LocalBook = _LocalBook(clock)
        if interval > 0 and shared_dir is not None:
            # A folder that cannot be used is found on the first start: pace in-process then.
            folder = default_runtime_dir() if shared_dir is ... else Path(shared_dir)
            digest = hashlib.sha256(self.origin.encode()).hexdigest()
            horizon = MAX_HOLD + CAPACITY * interval + 1.0
            self._book = _FileBook(folder / f"{digest}.pace", clock, horizon)
        self._line: deque[anyio.Event] = deque()

    @property
    def shared_path(self) -> Path | None:
        """The shared bucket file, or None when the bucket is in-process only."""
        return self._book.path if isinstance(self._book, _FileBook) else None

    async def wait_turn(self) -> None:
        """Return once this request may start (one token taken). Cancellation leaves at once
        (and raises), taking no token."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self.interval <= 0:
            return
        if not self._line and self._try_start() is None:
            return  # nobody in line and a token in the bucket: no wait
        turn = anyio.Event()
        self._line.append(turn)
        try:
            if self._line[0] is not turn:
                await turn.wait()  # set by the waiter ahead when it leaves the line
            while (retry_at := self._try_start()) is not None:
                delay = retry_at - self._clock()
                if delay > 0:
                    await anyio.sleep(max(delay, _MIN_PAUSE))
                else:
                    await anyio.lowlevel.checkpoint()
        finally:
            first = self._line[0] is turn
            self._line.remove(turn)
            if first and self._line:
                self._line[0].set()

    async def penalize(self, retry_after: float | None = None) -> None:
        """The API answered 429: empty the bucket of every worker and hold every start until
        ``retry_after`` seconds (capped at :data:`MAX_HOLD`) have passed."""
        if self.interval <= 0:
            return
        hold = retry_after if retry_after is not None and retry_after > 0 else 0.0  # NaN: 0
        hold = min(hold, MAX_HOLD)
        empty_for = hold + CAPACITY * self.interval

        def step(full_at: float, now: float) -> tuple[float, bool]:
            return max(full_at, now + empty_for), True

        # This process holds at once, even if publishing is cancelled below.
        self._book.full_at = max(self._book.full_at, self._clock() + empty_for)
        while True:
            if self._try(step) is not None:
                return
            await anyio.sleep(_LOCK_RETRY)  # the shared lock is busy

    def _take(self, full_at: float, now: float) -> tuple[float, tuple[bool, float]]:
        """(granted, when): a token taken at ``now``, or none before ``allowed``."""
        allowed = full_at - (CAPACITY - 1) * self.interval
        if now >= allowed:
            return max(full_at, now) + self.interval, (True, now)
        return full_at, (False, allowed)

    def _try_start(self) -> float | None:
        """Take a token now (None, after ``on_start``) or say when to try again."""
        outcome = self._try(self._take)
        if outcome is None:  # the shared lock is busy: another process is mid-update
            return self._clock() + _LOCK_RETRY
        granted, when = outcome
        if not granted:
            return when
        if self._on_start is not None:
            self._on_start(when)
        return None

    def _try(self, step: Step[R]) -> R | None:
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
            fallback = _LocalBook(self._clock)
            fallback.full_at = self._book.full_at
            self._book.close()
            self._book = fallback
            return self._book.transact(step)


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
    """The process-wide pacer of ``origin`` (capacity 40, one token per 250 ms unless
    ``PAPERCLIP_CREATEOS_PACE_MS`` says otherwise; shared across processes by default)."""
    key = normalize_origin(origin)
    with _registry_lock:
        pacer = _registry.get(key)
        if pacer is None:
            pacer = RequestPacer(key, interval=_env_interval())
            _registry[key] = pacer
        return pacer
