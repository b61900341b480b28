"""Sync in of one mapping, up to its placement text
(:class:`provider.driver.transfer.sync.SyncSession` runs the operation): pack a directory into a
host archive (exclusions, link policy, special files left out and reported) or take the file
itself, choose its mode (docs/protocol.md 5.4 step 3), then send its bytes: inline in the
operation's command when they fit what is left of its stdin
(:mod:`provider.driver.transfer.sync_inline`), otherwise one streamed ``PUT`` per byte range
(:mod:`provider.driver.transfer.sync_parts`). Answers what the operation's script needs to place it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import anyio

from provider.driver.transfer import sync_files, sync_inline, sync_parts
from provider.driver.transfer.archive import ArchiveStats, build_directory_archive
from provider.driver.transfer.sync_mapping import MappingSession
from provider.driver.transfer.sync_parts import Scratch
from provider.driver.transfer.sync_plan import FileMapping
from provider.errors import TransferError


@dataclass(frozen=True)
class Upload:
    """One mapping ready to place: its counts, its placement text, what it left out, and its
    bytes as base64 when they travel in the command's stdin (None: uploaded with PUT)."""

    files: int
    size: int
    text: str
    stats: ArchiveStats
    inline: str | None


async def upload(
    session: MappingSession, mapping: FileMapping, scratch: Scratch, room: int
) -> Upload:
    """Send one mapping to ``scratch``: inline when its base64 fits ``room`` characters (then
    nothing is sent yet and ``scratch.sent`` stays False: the command creates it), otherwise
    by PUT (as parts when it is larger than a part: ``scratch.parts`` is set before the first
    PUT, and ``scratch.sent``, once journaled, so cleanup knows; a source refused before that
    costs no request)."""
    stats = ArchiveStats(files=1, bytes=0)
    workdir = await session.new_workdir(None)
    try:
        if mapping.kind == "directory":
            data = workdir / "data"
            stats = await anyio.to_thread.run_sync(
                lambda: build_directory_archive(
                    mapping.host_path,
                    data,
                    exclude=mapping.exclude,
                    follow_symlinks=mapping.follow_symlinks,
                )
            )
            files = stats.files
            info = await anyio.to_thread.run_sync(os.stat, data)
            if stats.skipped:
                await _warn_skipped(session, mapping, stats)
        else:
            data, files = mapping.host_path, 1
            info = await anyio.to_thread.run_sync(sync_files.check_source_file, data)
        size = info.st_size
        if mapping.mode is not None:
            mode = mapping.mode
        elif mapping.kind == "directory":
            mode = 0o755
        else:
            mode = info.st_mode & 0o777  # the host file's own
        if size <= session.part_bytes and sync_inline.encoded_length(size) <= room:
            content = await anyio.to_thread.run_sync(_read_exactly, data, size)
            text = (
                sync_inline.receive_text(scratch.path, size)
                + "\n"
                + _placement(scratch, mapping, mode)
            )
            return Upload(files, size, text, stats, sync_inline.encode(content))
        if size > session.part_bytes:
            parts = sync_parts.part_count(size, session.part_bytes)
            if parts > sync_parts.MAX_PARTS:
                raise TransferError(
                    f"{mapping.host_path} is too large to sync: more than "
                    f"{sync_parts.MAX_PARTS} parts of {session.part_bytes} bytes."
                )
            scratch.parts = parts
        await session.journal_scratch(scratch.path)
        scratch.sent = True
        await sync_files.put_ranges(
            session.client,
            session.sandbox_id,
            sync_parts.byte_ranges(scratch, size, session.part_bytes),
            data,
            log=session.log,
            what=f"Uploading {mapping.sandbox_path}",
        )
    finally:
        await session.drop_workdir(workdir)
    return Upload(files, size, _placement(scratch, mapping, mode), stats, None)


def _placement(scratch: Scratch, mapping: FileMapping, mode: int) -> str:
    return sync_parts.placement_text(scratch, mapping.kind, mapping.sandbox_path, mode)


def _read_exactly(path: Path, size: int) -> bytes:
    """The ``size`` bytes of ``path``; a file that changed size since it was measured fails
    the transfer (as a PUT of it would), never sending a torn copy."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        content = handle.read(size + 1)
    if len(content) != size:
        raise TransferError(
            f"Reading {path} failed on the host: it changed size while being sent "
            f"({size} bytes measured, {len(content)} read); sync it again once it is stable."
        )
    return content


async def _warn_skipped(session: MappingSession, mapping: FileMapping, stats: ArchiveStats) -> None:
    """One warn log line for the sockets, FIFOs and devices a directory upload left out."""
    if session.log is not None:
        names = stats.skipped_names
        listed = ", ".join(names) + (", ..." if stats.skipped > len(names) else "")
        await session.log(
            "warn",
            f"Sync in of {mapping.host_path}: {stats.skipped} special file(s) (FIFO, "
            f"socket or device) left out, not transferred: {listed}",
            None,
        )
