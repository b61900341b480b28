"""environmentSyncIn / environmentSyncOut: move files between host paths and the workspace.

Bytes never cross JSON-RPC and never go through process output: they are streamed through the
files API between host temp files and sandbox scratch files, and a guarded control command
(provider.driver.shell) moves them into place inside the sandbox. See provider-behavior.md 5.

Large trees and files: the files API takes at most about 500 MiB per file (413 above it), so the
byte stream of a mapping (the tar archive of a directory, or a file) travels as byte-range parts
of at most ``part_bytes`` (:data:`PART_BYTES`, 256 MiB, by default; a :class:`SyncSession`
parameter for tests), named ``<scratch>.part-0000``, ``.part-0001``, ... in the sandbox
(details and the in-sandbox texts in :mod:`provider.driver.sync_steps`):

- inbound, the host archive (already a host temp file) or the host file is uploaded as one
  streamed ``PUT`` per byte range, never read into memory; the placement step of the operation's
  one command feeds the parts in order to ``tar -xf -`` (or appends them into the scratch file
  before its ``chmod``/``mv``), and its ``EXIT`` trap removes every part. A mapping at or under
  the part size is one ``PUT`` of the whole file to the scratch path, exactly as before;
- outbound, the pack command always pipes into GNU ``split`` and prints the part count (a small
  tree is one part), the host ``GET``s the parts in order, appending each to the one host
  ``data`` file (streamed), and validates the whole archive (5.7) before extracting anything;
  the cleanup ``exec`` removes the scratch and every part with a glob.

Request counts stay those of a single file for everything at or under the part size (inbound:
one ``PUT`` per mapping plus the operation's command; outbound: the pack command, one ``GET``, the
cleanup); each further part adds one ``PUT`` or one ``GET``. Failures behave as before: a failing
part upload fails the sync and the scratch and its parts are removed, a partial download leaves
the host target untouched and no temp file, and cancellation runs the cleanup shielded and
bounded.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import anyio

from provider.createos.client import CreateOSClient
from provider.driver import sync_steps
from provider.driver.archive import build_directory_archive, extract_archive
from provider.driver.execute import CommandSpec, ProcessRecord, run_command
from provider.driver.journal import LeaseJournal
from provider.driver.runtime import ROOT
from provider.driver.sync_plan import FileMapping, PlannedOperation
from provider.errors import ProviderError, TransferError

LogSink = Callable[[str, str, dict[str, Any] | None], Awaitable[None]]
PROGRESS_THRESHOLD = 64 * 1024 * 1024
PROGRESS_INTERVAL = 2.0
WRITE_BATCH = 1024 * 1024
PART_BYTES: Final = 256 * 1024 * 1024
"""Largest byte range one PUT or GET of a sync carries (CreateOS takes about 500 MiB a file)."""
SCRATCH_PREFIX: Final = "/tmp/paperclip-createos-transfer-"


class SyncSession:
    """One sync call on one sandbox: runs planned operations in order, with accounting."""

    def __init__(
        self,
        client: CreateOSClient,
        sandbox_id: str,
        *,
        cleanup_timeout: float,
        log: LogSink | None,
        journal: LeaseJournal | None = None,
        record: ProcessRecord | None = None,
        part_bytes: int | None = None,
    ) -> None:
        """``journal`` records host temp folders, ``record`` the sandbox processes (control
        and post-upload commands), so a worker crash leaves neither behind for good.
        ``part_bytes`` (default :data:`PART_BYTES`, read when the session is made) is the
        largest byte range one transfer request carries; larger archives and files travel as
        parts (module docstring)."""
        part_bytes = PART_BYTES if part_bytes is None else part_bytes
        if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes < 1:
            raise ValueError("part_bytes must be a positive integer")
        self.part_bytes = part_bytes
        self.client = client
        self.sandbox_id = sandbox_id
        self.cleanup_timeout = cleanup_timeout
        self.log = log
        self.journal = journal
        self.record = record

    async def _new_workdir(self, parent: Path | None) -> Path:
        """A fresh 0700 host temp folder, journaled so a crash cannot leave it behind."""
        workdir: Path = await anyio.to_thread.run_sync(_make_workdir, parent)
        if self.journal is not None:
            await anyio.to_thread.run_sync(self.journal.add_tempdir, workdir)
        return workdir

    async def _drop_workdir(self, workdir: Path) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(workdir, ignore_errors=True))
            if self.journal is not None:
                await anyio.to_thread.run_sync(self.journal.remove_tempdir, workdir)

    async def sync_in(self, operations: list[PlannedOperation]) -> list[dict[str, Any]]:
        results = []
        for op in operations:
            results.append(await self._sync_in_operation(op))
        return results

    async def _sync_in_operation(self, op: PlannedOperation) -> dict[str, Any]:
        """Upload every mapping, then place them and run the post-upload commands in one
        sandbox command (provider.driver.sync_steps); scratch files left by a failure before
        that command ran are removed here."""
        scratches: list[sync_steps.Scratch] = []
        steps: list[sync_steps.Step] = []
        files = transferred = 0
        placed = False
        try:
            for mapping in op.mappings:
                scratch = sync_steps.Scratch(_new_scratch())
                scratches.append(scratch)
                count, size, text = await self._upload(mapping, scratch)
                steps.append(sync_steps.Step(f"Placing {mapping.sandbox_path}", text))
                files, transferred = files + count, transferred + size
            for command in op.post_upload:
                budget = command.timeout if command.timeout is not None else math.inf
                remaining = anyio.current_effective_deadline() - anyio.current_time()
                steps += sync_steps.post_upload_steps(
                    command.command, command.cwd, min(budget, remaining)
                )
            if steps:
                await self._run_steps(steps, scratches)
            placed = True
        finally:
            if not placed:
                for scratch in scratches:
                    await self._remove_scratch(scratch)
        return _result(op, files, transferred)

    async def sync_out(self, operations: list[PlannedOperation]) -> list[dict[str, Any]]:
        results = []
        for op in operations:
            files = transferred = 0
            for mapping in op.mappings:
                count, size = await self._download(mapping)
                files, transferred = files + count, transferred + size
            results.append(_result(op, files, transferred))
        return results

    # -- inbound -----------------------------------------------------------------------------

    async def _upload(
        self, mapping: FileMapping, scratch: sync_steps.Scratch
    ) -> tuple[int, int, str]:
        """PUT one mapping to ``scratch`` (as parts when it is larger than a part: then
        ``scratch.parts`` is set before the first PUT, so cleanup knows); answers (files,
        bytes, the placement text)."""
        workdir = await self._new_workdir(None)
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
                files, mode = stats.files, 0o755 if mapping.mode is None else mapping.mode
            else:
                data = mapping.host_path
                host_mode = (await anyio.to_thread.run_sync(os.stat, data)).st_mode & 0o777
                files, mode = 1, host_mode if mapping.mode is None else mapping.mode
            size = (await anyio.to_thread.run_sync(os.stat, data)).st_size
            if size > self.part_bytes:
                parts = sync_steps.part_count(size, self.part_bytes)
                if parts > sync_steps.MAX_PARTS:
                    raise TransferError(
                        f"{mapping.host_path} is too large to sync: more than "
                        f"{sync_steps.MAX_PARTS} parts of {self.part_bytes} bytes."
                    )
                scratch.parts = parts
            await self._put_with_progress(_ranges(scratch, size, self.part_bytes), data, mapping)
        finally:
            await self._drop_workdir(workdir)
        text = sync_steps.placement_text(scratch, mapping.kind, mapping.sandbox_path, mode)
        return files, size, text

    async def _put_with_progress(
        self, ranges: list[tuple[str, int, int]], data: Path, mapping: FileMapping
    ) -> None:
        """One streamed PUT per ``(sandbox path, offset, length)`` range of ``data``, in order."""
        total = sum(length for _, _, length in ranges)
        done = current = 0

        def progress(count: int) -> None:
            nonlocal current
            current = count

        async def put_all(on_progress: Callable[[int], None] | None) -> None:
            nonlocal done, current
            for path, offset, length in ranges:
                current = 0
                await self.client.put_file(
                    self.sandbox_id,
                    path,
                    data,
                    offset=offset,
                    length=length,
                    on_progress=on_progress,
                )
                done += length

        if total <= PROGRESS_THRESHOLD or self.log is None:
            await put_all(None)
            return
        what = f"Uploading {mapping.sandbox_path}"
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._report, lambda: done + current, total, what)
                await put_all(progress)
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            if len(group.exceptions) == 1:  # the upload's own error, not a group, for callers
                raise group.exceptions[0] from None
            raise

    async def _report(self, current: Callable[[], int], total: int, what: str) -> None:
        assert self.log is not None
        while True:
            await anyio.sleep(PROGRESS_INTERVAL)
            await self.log("info", f"{what}: {current() >> 20} of {total >> 20} MiB", None)

    # -- outbound ----------------------------------------------------------------------------

    async def _download(self, mapping: FileMapping) -> tuple[int, int]:
        """Pack in the sandbox (into parts), GET every part into one host file, then install
        it (file) or validate and extract it (directory)."""
        scratch = _new_scratch()
        target = mapping.host_path
        if mapping.kind == "directory":
            script = sync_steps.syncout_dir_parts_command(
                mapping.sandbox_path,
                scratch,
                self.part_bytes,
                exclude=mapping.exclude,
                follow_symlinks=mapping.follow_symlinks,
            )
        else:
            script = sync_steps.syncout_file_parts_command(
                mapping.sandbox_path, scratch, self.part_bytes
            )
        file_mode = 0o600 if mapping.mode is None else mapping.mode
        workdir: Path | None = None
        try:
            what = f"Packing {mapping.sandbox_path}"
            packed = await self._control(script, what)
            try:
                parts = sync_steps.parse_part_count(packed["stdout"])
            except ValueError as exc:
                raise TransferError(f"{what} failed in the sandbox: {exc}.") from None
            parents = await anyio.to_thread.run_sync(_make_parents, target.parent)
            workdir = await self._new_workdir(target.parent)
            data = workdir / "data"
            paths = [sync_steps.part_path(scratch, index) for index in range(parts)]
            size = await self._get_to_file(paths, data, file_mode, mapping)
            if mapping.kind == "directory":
                files = await anyio.to_thread.run_sync(
                    lambda: extract_archive(data, target, mode=mapping.mode)
                )
                if mapping.mode is not None:  # new directories get the mapping's mode (5.6)
                    for directory in parents:
                        await anyio.to_thread.run_sync(directory.chmod, mapping.mode)
            else:
                await anyio.to_thread.run_sync(_install_file, data, target, file_mode)
                files = 1
            return files, size
        finally:
            if workdir is not None:
                await self._drop_workdir(workdir)
            await self._remove_scratch(sync_steps.Scratch(scratch, parts=1))

    async def _get_to_file(
        self, paths: list[str], data: Path, mode: int, mapping: FileMapping
    ) -> int:
        """GET each sandbox path in order, appending it to ``data`` (created exclusively with
        ``mode``), in batches of WRITE_BATCH: never more than a batch in memory."""
        fd = await anyio.to_thread.run_sync(
            lambda: os.open(data, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode & 0o600)
        )
        size = reported = 0
        pending: list[bytes] = []
        pending_size = 0
        try:
            for path in paths:
                async with self.client.get_file(self.sandbox_id, path) as body:
                    async for chunk in body:
                        pending.append(chunk)
                        pending_size += len(chunk)
                        if pending_size < WRITE_BATCH:
                            continue
                        await anyio.to_thread.run_sync(_write_all, fd, b"".join(pending))
                        size += pending_size
                        pending, pending_size = [], 0
                        if size - reported >= PROGRESS_THRESHOLD and self.log is not None:
                            reported = size
                            await self.log(
                                "info",
                                f"Downloading {mapping.sandbox_path}: {size >> 20} MiB",
                                None,
                            )
            if pending:
                await anyio.to_thread.run_sync(_write_all, fd, b"".join(pending))
                size += pending_size
        finally:
            await anyio.to_thread.run_sync(os.close, fd)
        return size

    # -- sandbox commands --------------------------------------------------------------------

    async def _control(self, script: str, what: str) -> dict[str, Any]:
        """One control command (spec 5.3); a timeout or non-zero exit fails the transfer."""
        result = await self._command(script)
        if result["timedOut"]:
            raise TransferError(f"{what} timed out in the sandbox.")
        if result["exitCode"] != 0:
            raise TransferError(_failure(what, result, result["stderr"]))
        return result

    async def _run_steps(
        self, steps: list[sync_steps.Step], scratches: list[sync_steps.Scratch]
    ) -> None:
        """One sandbox command for the steps of an inbound operation; errors name the step."""
        result = await self._command(sync_steps.operation_script(steps, scratches))
        if not result["timedOut"] and result["exitCode"] == 0:
            return
        failed = sync_steps.failed_step(steps, result["stderr"])
        label = failed.label if failed is not None else "Placing the uploaded files"
        if result["timedOut"] or (failed is not None and failed.timed_out):
            raise TransferError(f"{label} timed out in the sandbox.")
        detail = failed.detail if failed is not None else result["stderr"]
        raise TransferError(_failure(label, result, detail))

    async def _command(self, script: str) -> dict[str, Any]:
        """``bash -c script`` in ROOT, no live logs, within what is left of the sync deadline."""
        remaining = anyio.current_effective_deadline() - anyio.current_time()
        return await run_command(
            self.client,
            self.sandbox_id,
            CommandSpec(
                command="/bin/bash", args=["-c", script], cwd=ROOT, timeout=max(remaining, 0.001)
            ),
            on_output=None,
            cleanup_timeout=self.cleanup_timeout,
            record=self.record,
        )

    async def _remove_scratch(self, scratch: sync_steps.Scratch) -> None:
        """One ``exec`` (shielded, bounded, errors swallowed): ``rm -f`` of the scratch file, or
        of the scratch and every ``.part-*`` of it (a glob, so partial parts go too)."""
        if scratch.parts:
            command, args = sync_steps.removal_command(scratch.path)
        else:
            command, args = "/bin/rm", ["-f", "--", scratch.path]
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(self.cleanup_timeout),
            contextlib.suppress(ProviderError),
        ):
            await self.client.exec(self.sandbox_id, command, args)


def _failure(what: str, result: dict[str, Any], stderr: str) -> str:
    detail = stderr.strip()[-300:]
    code = result["exitCode"] if result["exitCode"] is not None else result.get("signal")
    return f"{what} failed in the sandbox (exit {code})" + (f": {detail}" if detail else ".")


def _result(op: PlannedOperation, files: int, transferred: int) -> dict[str, Any]:
    return {
        "operationId": op.operation_id,
        "filesTransferred": files,
        "bytesTransferred": transferred,
    }


def _make_parents(directory: Path) -> list[Path]:
    """``mkdir -p`` where every new directory is 0700 (Path.mkdir gives parents the umask
    default, usually 0755); returns the directories created."""
    missing: list[Path] = []
    current = directory
    while not os.path.lexists(current):
        missing.append(current)
        current = current.parent
    created: list[Path] = []
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # e.g. "a/.." once "a" exists: not ours to chmod later
            continue
        created.append(path)
    return created


def _new_scratch() -> str:
    return f"{SCRATCH_PREFIX}{uuid.uuid4().hex}"


def _ranges(scratch: sync_steps.Scratch, size: int, part_bytes: int) -> list[tuple[str, int, int]]:
    """``(sandbox path, offset, length)`` of each PUT: the whole file, or each part."""
    if not scratch.parts:
        return [(scratch.path, 0, size)]
    return [
        (
            sync_steps.part_path(scratch.path, index),
            index * part_bytes,
            min(part_bytes, size - index * part_bytes),
        )
        for index in range(scratch.parts)
    ]


def _make_workdir(parent: Path | None) -> Path:
    return Path(tempfile.mkdtemp(prefix=".paperclip-createos-", dir=parent))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _install_file(data: Path, target: Path, mode: int) -> None:
    """Give the complete download its final mode, then rename it over the target atomically."""
    if target.is_dir() and not target.is_symlink():
        raise TransferError("The sync-out target is a directory, but the source is a file.")
    data.chmod(mode)
    data.replace(target)
