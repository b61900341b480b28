# Raw os calls on guest paths: this file runs standalone, by the host python3, in the guest.
# Builtin modules only (no contextlib): try/except/pass stands in for suppress().
# ruff: noqa: PTH103, PTH104, PTH108, PTH112, PTH115, PTH118, PTH119, PTH120
# ruff: noqa: SIM105
"""In-guest file operations of the supervisor, and the error every guest operation raises.

Imported by ``guest_supervisor.py`` (builtin modules only, like it). Paths are resolved in the
guest view and must land inside the three writable trees, so a guest symlink can never reach a
host file; the opened descriptor is passed to the emulator, which moves the bytes.
"""

from __future__ import annotations

import errno
import os
import stat
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ROOTS = ("/paperclip-workspace", "/tmp", "/root")
UPLOAD_PREFIX = ".createos-upload-"


class OpError(Exception):
    """A request that cannot be performed; ``code`` is a short machine word."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def inside_roots(path: str) -> bool:
    return any(path == r or path.startswith(r + "/") for r in ROOTS)


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def check_path(path: Any) -> str:
    """Resolve an API path in the guest view; it must land inside the writable trees."""
    if not isinstance(path, str) or not path:
        raise OpError("invalid", "path is required")
    if "\x00" in path:
        raise OpError("invalid", "path contains a NUL byte")
    if not path.startswith("/"):
        raise OpError("relative", "path must be absolute")
    real = os.path.realpath(path)
    if not inside_roots(real):
        raise OpError("outside", "path is outside the writable trees")
    if real in ROOTS:
        raise OpError("is_dir", "path is a directory")
    return real


def open_for_read(path: Any) -> tuple[int, int]:
    real = check_path(path)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise OpError("not_found", "no such file") from exc
    except NotADirectoryError as exc:
        raise OpError("not_found", "no such file") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OpError("outside", "path changed while opening") from exc
        raise OpError("denied", os.strerror(exc.errno or errno.EIO)) from exc
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise OpError("is_dir", "path is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise OpError("not_regular", "path is not a regular file")
        if not inside_roots(_fd_path(fd)):
            raise OpError("outside", "path is outside the writable trees")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def open_for_write(path: Any) -> tuple[int, str, str]:
    """Create parents and a temp file next to the target; answer (fd, temp path, target)."""
    real = check_path(path)
    if os.path.isdir(real):
        raise OpError("is_dir", "path is a directory")
    parent = os.path.dirname(real)
    try:
        os.makedirs(parent, exist_ok=True)
    except (NotADirectoryError, FileExistsError) as exc:
        raise OpError("not_dir", "a parent of the path is not a directory") from exc
    except OSError as exc:
        raise OpError("denied", os.strerror(exc.errno or errno.EIO)) from exc
    real_parent = os.path.realpath(parent)
    if not inside_roots(real_parent):
        raise OpError("outside", "path is outside the writable trees")
    tmp = os.path.join(real_parent, f"{UPLOAD_PREFIX}{os.getpid()}-{time.monotonic_ns()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o644)
    except OSError as exc:
        raise OpError("denied", os.strerror(exc.errno or errno.EIO)) from exc
    if not inside_roots(os.path.dirname(_fd_path(fd))):
        os.close(fd)
        os.unlink(tmp)
        raise OpError("outside", "path is outside the writable trees")
    return fd, tmp, os.path.join(real_parent, os.path.basename(real))


def commit(tmp: str, target: str) -> None:
    """Rename an uploaded temp file onto its target (the temp file goes on failure)."""
    if not (inside_roots(tmp) and inside_roots(target)):
        raise OpError("outside", "path is outside the writable trees")
    try:
        os.rename(tmp, target)
    except IsADirectoryError as exc:
        unlink_quietly(tmp)
        raise OpError("is_dir", "path is a directory") from exc
    except OSError:
        unlink_quietly(tmp)
        raise


def abort(tmp: str) -> None:
    if inside_roots(tmp) and os.path.basename(tmp).startswith(UPLOAD_PREFIX):
        unlink_quietly(tmp)


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
