"""The host side of a sync's transfers: temp folders, streamed PUTs and GETs, the final install.

Bytes never sit whole in memory: :func:`put_ranges` streams byte ranges of a host file (the
archive a directory was packed into, or the mapped file itself) with one ``PUT`` each, and
:func:`get_to_file` appends ``GET`` bodies to one host file in batches of :data:`WRITE_BATCH`.
Transfers over :data:`PROGRESS_THRESHOLD` report progress to the call's log every
:data:`PROGRESS_INTERVAL` seconds (uploads) or every :data:`PROGRESS_THRESHOLD` bytes
(downloads). Host files are created 0600 and folders 0700; a download replaces its target only
once complete (:func:`install_file`). Journaling the temp folders and choosing what to transfer
is :class:`provider.driver.transfer.sync.SyncSession`'s.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio

from provider.createos.client import CreateOSClient
from provider.errors import TransferError

LogSink = Callable[[str, str, dict[str, Any] | None], Awaitable[None]]
PROGRESS_THRESHOLD = 64 * 1024 * 1024
PROGRESS_INTERVAL = 2.0
WRITE_BATCH = 1024 * 1024
try:  # buffers one writev may take (Linux and macOS: 1024; POSIX guarantees 16)
    IOV_MAX = max(16, min(1024, os.sysconf("SC_IOV_MAX")))
except (ValueError, OSError):
    IOV_MAX = 16


async def put_ranges(
    client: CreateOSClient,
    sandbox_id: str,
    ranges: list[tuple[str, int, int]],
    data: Path,
    *,
    log: LogSink | None,
    what: str,
) -> None:
    """One streamed PUT per ``(sandbox path, offset, length)`` range of ``data``, in order;
    ``what`` ("Uploading <sandbox path>") heads the progress lines."""
    total = sum(length for _, _, length in ranges)
    done = current = 0

    def progress(count: int) -> None:
        nonlocal current
        current = count

    async def put_all(on_progress: Callable[[int], None] | None) -> None:
        nonlocal done, current
        for path, offset, length in ranges:
            current = 0
            await client.put_file(
                sandbox_id,
                path,
                data,
                offset=offset,
                length=length,
                on_progress=on_progress,
            )
            done += length

    if total <= PROGRESS_THRESHOLD or log is None:
        await put_all(None)
        return
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_report, log, lambda: done + current, total, what)
            await put_all(progress)
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:  # the upload's own error, not a group, for callers
            raise group.exceptions[0] from None
        raise


async def _report(log: LogSink, current: Callable[[], int], total: int, what: str) -> None:
    while True:
        await anyio.sleep(PROGRESS_INTERVAL)
        await log("info", f"{what}: {current() >> 20} of {total >> 20} MiB", None)


async def get_to_file(
    client: CreateOSClient,
    sandbox_id: str,
    parts: list[tuple[str, int]],
    data: Path,
    mode: int,
    *,
    log: LogSink | None,
    what: str,
) -> int:
    """GET each ``(sandbox path, expected size)`` in order, appending it to ``data`` (created
    exclusively with ``mode``), in batches of WRITE_BATCH: never more than a batch in memory.
    A body that is not the file (a JSON or HTML content type, or not exactly the size the pack
    step measured) fails the transfer. Answers the bytes written; ``what`` ("Downloading
    <sandbox path>") heads the progress lines and the errors."""
    fd = await anyio.to_thread.run_sync(_create, data, mode)
    size = reported = 0
    pending: list[bytes] = []
    pending_size = 0
    try:
        for path, expected in parts:
            start = size + pending_size
            async with client.get_file(sandbox_id, path) as body:
                _check_content_type(getattr(body, "content_type", ""), what)
                async for chunk in body:
                    pending.append(chunk)
                    pending_size += len(chunk)
                    if size + pending_size - start > expected:
                        break  # already more than the file: no need to read the rest
                    if pending_size < WRITE_BATCH:
                        continue
                    await anyio.to_thread.run_sync(_write_all, fd, pending)
                    size += pending_size
                    pending, pending_size = [], 0
                    if size - reported >= PROGRESS_THRESHOLD and log is not None:
                        reported = size
                        await log("info", f"{what}: {size >> 20} MiB", None)
            got = size + pending_size - start
            if got != expected:
                raise TransferError(
                    f"{what} failed: the sandbox packed {expected} bytes but the download "
                    f"{'brought more' if got > expected else f'brought {got}'}, so the answer "
                    "was not the file; nothing was installed."
                )
        if pending:
            await anyio.to_thread.run_sync(_write_all, fd, pending)
            size += pending_size
    finally:
        await anyio.to_thread.run_sync(os.close, fd)
    return size


def write_new(data: Path, content: bytes, mode: int) -> None:
    """Write ``content`` to ``data``, created exclusively with ``mode`` (as :func:`get_to_file`
    creates its file): the host side of an outbound sync that came back inline."""
    fd = _create(data, mode)
    try:
        _write_all(fd, [content])
    finally:
        os.close(fd)


def _create(data: Path, mode: int) -> int:
    """Create ``data`` exclusively, at most owner read/write until the install sets ``mode``."""
    return os.open(data, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode & 0o600)


_NOT_A_FILE = ("application/json", "text/html", "application/xhtml+xml", "application/problem")


def _check_content_type(content_type: str, what: str) -> None:
    """Refuse a download answered as JSON (an error envelope) or HTML (a gateway or captive
    portal page): CreateOS and the emulator send files as ``application/octet-stream``, and
    other or missing types are left to the size check."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media.startswith(_NOT_A_FILE) or media.endswith("+json"):
        raise TransferError(
            f"{what} failed: the answer was {media}, not the file's bytes (a gateway, proxy or "
            "error page?); nothing was installed."
        )


def _write_all(fd: int, chunks: list[bytes]) -> None:
    """Write every chunk, in order, with ``writev`` (no joined copy; partial writes resume)."""
    views = [memoryview(chunk) for chunk in chunks if chunk]
    start = 0
    while start < len(views):
        written = os.writev(fd, views[start : start + IOV_MAX])
        while written and start < len(views):
            if written >= len(views[start]):
                written -= len(views[start])
                start += 1
            else:
                views[start] = views[start][written:]
                written = 0


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def check_source_file(path: Path) -> os.stat_result:
    """The stat of a ``kind: file`` sync-in source, checked without ever blocking: it is opened
    ``O_NONBLOCK`` (a FIFO with no writer would block a plain open forever) and must be a
    regular file, and one whose size reads 0 must really be empty (``/proc`` and ``/sys``
    files read 0 but have content, which an upload of 0 bytes would silently lose)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _KINDS if test(info.st_mode)), "a device")
            raise TransferError(
                f"Reading {path} failed on the host: it is {kind}, not a regular file; "
                "a kind: file mapping syncs regular files only."
            )
        if info.st_size == 0 and os.read(fd, 1):
            raise TransferError(
                f"Reading {path} failed on the host: its size reads 0 but it has content "
                "(a /proc or /sys file?); copy it to a regular file and sync that."
            )
        return info
    finally:
        os.close(fd)


def make_workdir(parent: Path | None) -> Path:
    """A fresh 0700 folder (``mkdtemp``) in ``parent``, or in the system temp folder."""
    return Path(tempfile.mkdtemp(prefix=".paperclip-createos-", dir=parent))


def make_dirs(directory: Path) -> list[Path]:
    """``mkdir -p`` where every new directory is 0700 (Path.mkdir gives parents the umask
    default, usually 0755); returns the directories this call created, outermost first.

    A component that appears meanwhile is used when it is a real directory (it is not ours, so
    it is not returned to be chmod-ed), and refused when it is a link or anything else."""
    missing: list[Path] = []
    current = directory
    while not os.path.lexists(current):
        missing.append(current)
        current = current.parent
    created: list[Path] = []
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # e.g. "a/.." once "a" exists
            if path.is_symlink() or not path.is_dir():
                raise
            continue
        created.append(path)
    return created


def remove_new_dirs(created: list[Path]) -> None:
    """Undo :func:`make_dirs` after a failure: remove the directories it created, innermost
    first, each only if it is empty (errors ignored: what holds something stays)."""
    for directory in reversed(created):
        with contextlib.suppress(OSError):
            directory.rmdir()


@contextlib.contextmanager
def host_errors(what: str) -> Iterator[None]:
    """A host file error (a parent that is a file, a source gone, a full disk) becomes a
    :class:`TransferError` naming the step and its cause, instead of an internal error."""
    try:
        yield
    except TimeoutError:
        raise
    except OSError as exc:
        cause = exc.strerror or type(exc).__name__
        where = f" ({exc.filename})" if exc.filename is not None else ""
        raise TransferError(f"{what} failed on the host: {cause}{where}.") from exc


def install_file(data: Path, target: Path, mode: int) -> None:
    """Give the complete download its final mode, then rename it over the target atomically."""
    if target.is_dir() and not target.is_symlink():
        raise TransferError("The sync-out target is a directory, but the source is a file.")
    data.chmod(mode)
    data.replace(target)
