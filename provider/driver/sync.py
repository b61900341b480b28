"""environmentSyncIn / environmentSyncOut: move files between host paths and the workspace.

Bytes never cross JSON-RPC and never go through process output: they are streamed through the
files API between host temp files and sandbox scratch files, and a guarded control command moves
them into place inside the sandbox. See provider-behavior.md 5. This module orchestrates, per
mapping, what to pack, send, place, fetch and clean up; the pieces are
:mod:`provider.driver.sync_files` (the host side: temp folders, streamed ``PUT``s of byte ranges
of a host file, ``GET``s appended to one host file, the atomic install),
:mod:`provider.driver.sync_steps` (the one sandbox command of an inbound operation) and
:mod:`provider.driver.sync_parts` (byte-range parts and the texts that place or pack them).

Large trees and files: the files API takes at most about 500 MiB per file (413 above it), so a
mapping's byte stream (the tar archive of a directory, or a file) larger than ``part_bytes``
(:data:`PART_BYTES`, 256 MiB, by default; a :class:`SyncSession` parameter for tests) travels
as ``<scratch>.part-0000``, ``.part-0001``, ... Inbound, one streamed ``PUT`` per byte range of
the host file, consumed in order by the placement step; at or under the part size, one ``PUT``
of the whole file to the scratch path, exactly as before. Outbound, the pack command always
splits (a small tree is one part) and prints the part count, the host ``GET``s the parts in
order into one host file and validates the whole archive (5.7) before extracting anything.

Request counts stay those of a single file for everything at or under the part size (inbound:
one ``PUT`` per mapping plus the operation's command; outbound: the pack command, one ``GET``, the
cleanup); each further part adds one ``PUT`` or one ``GET``. A failing part upload fails the
sync and the scratch and its parts are removed, a partial download leaves the host target
untouched and no temp file, and cancellation runs the cleanup (a glob over the parts) shielded
and bounded.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Final

import anyio

from provider.createos.client import CreateOSClient
from provider.driver import sync_files, sync_parts, sync_steps
from provider.driver.archive import build_directory_archive, extract_archive
from provider.driver.budget import CleanupBound, as_bound
from provider.driver.execute import CommandSpec, ProcessRecord, run_command
from provider.driver.journal import LeaseJournal
from provider.driver.runtime import ROOT
from provider.driver.sync_files import LogSink
from provider.driver.sync_parts import Scratch
from provider.driver.sync_plan import FileMapping, PlannedOperation
from provider.errors import ProviderError, TransferError

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
        cleanup_timeout: CleanupBound | float,
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
        self.cleanup_timeout = as_bound(cleanup_timeout)  # one bound for every cleanup
        self.log = log
        self.journal = journal
        self.record = record

    async def _new_workdir(self, parent: Path | None) -> Path:
        """A fresh 0700 host temp folder, journaled so a crash cannot leave it behind."""
        workdir: Path = await anyio.to_thread.run_sync(sync_files.make_workdir, parent)
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
        scratches: list[Scratch] = []
        steps: list[sync_steps.Step] = []
        files = transferred = 0
        placed = False
        try:
            for mapping in op.mappings:
                scratch = Scratch(_new_scratch())
                scratches.append(scratch)
                with sync_files.host_errors(f"Reading {mapping.host_path}"):
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
                with sync_files.host_errors(f"Writing {mapping.host_path}"):
                    count, size = await self._download(mapping)
                files, transferred = files + count, transferred + size
            results.append(_result(op, files, transferred))
        return results

    # -- inbound -----------------------------------------------------------------------------

    async def _upload(self, mapping: FileMapping, scratch: Scratch) -> tuple[int, int, str]:
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
                files = stats.files
            else:
                data, files = mapping.host_path, 1
            info = await anyio.to_thread.run_sync(os.stat, data)  # one stat: size and mode
            size = info.st_size
            if mapping.mode is not None:
                mode = mapping.mode
            elif mapping.kind == "directory":
                mode = 0o755
            else:
                mode = info.st_mode & 0o777  # the host file's own
            if size > self.part_bytes:
                parts = sync_parts.part_count(size, self.part_bytes)
                if parts > sync_parts.MAX_PARTS:
                    raise TransferError(
                        f"{mapping.host_path} is too large to sync: more than "
                        f"{sync_parts.MAX_PARTS} parts of {self.part_bytes} bytes."
                    )
                scratch.parts = parts
            await sync_files.put_ranges(
                self.client,
                self.sandbox_id,
                sync_parts.byte_ranges(scratch, size, self.part_bytes),
                data,
                log=self.log,
                what=f"Uploading {mapping.sandbox_path}",
            )
        finally:
            await self._drop_workdir(workdir)
        text = sync_parts.placement_text(scratch, mapping.kind, mapping.sandbox_path, mode)
        return files, size, text

    # -- outbound ----------------------------------------------------------------------------

    async def _download(self, mapping: FileMapping) -> tuple[int, int]:
        """Pack in the sandbox (into parts), GET every part into one host file, then install
        it (file) or validate and extract it (directory)."""
        scratch = _new_scratch()
        target = mapping.host_path
        if mapping.kind == "directory":
            script = sync_parts.syncout_dir_parts_command(
                mapping.sandbox_path,
                scratch,
                self.part_bytes,
                exclude=mapping.exclude,
                follow_symlinks=mapping.follow_symlinks,
            )
        else:
            script = sync_parts.syncout_file_parts_command(
                mapping.sandbox_path, scratch, self.part_bytes
            )
        file_mode = 0o600 if mapping.mode is None else mapping.mode
        workdir: Path | None = None
        parents: list[Path] = []
        installed = False
        try:
            what = f"Packing {mapping.sandbox_path}"
            packed = await self._control(script, what)
            try:
                parts = sync_parts.parse_part_count(packed["stdout"])
            except ValueError as exc:
                raise TransferError(f"{what} failed in the sandbox: {exc}.") from None
            parents = await anyio.to_thread.run_sync(sync_files.make_dirs, target.parent)
            workdir = await self._new_workdir(target.parent)
            data = workdir / "data"
            size = await sync_files.get_to_file(
                self.client,
                self.sandbox_id,
                [sync_parts.part_path(scratch, index) for index in range(parts)],
                data,
                file_mode,
                log=self.log,
                what=f"Downloading {mapping.sandbox_path}",
            )
            if mapping.kind == "directory":
                staging = workdir  # the staged tree goes next to the target (same filesystem)
                files = await anyio.to_thread.run_sync(
                    lambda: extract_archive(data, target, mode=mapping.mode, workdir=staging)
                )
                if mapping.mode is not None:  # new directories get the mapping's mode (5.6)
                    for directory in parents:
                        await anyio.to_thread.run_sync(directory.chmod, mapping.mode)
            else:
                await anyio.to_thread.run_sync(sync_files.install_file, data, target, file_mode)
                files = 1
            installed = True
            return files, size
        finally:
            if workdir is not None:
                await self._drop_workdir(workdir)
            if not installed and parents:  # a failed sync leaves no new empty folders
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(sync_files.remove_new_dirs, parents)
            await self._remove_scratch(Scratch(scratch, parts=1))

    # -- sandbox commands --------------------------------------------------------------------

    async def _control(self, script: str, what: str) -> dict[str, Any]:
        """One control command (spec 5.3); a timeout or non-zero exit fails the transfer."""
        result = await self._command(script)
        if result["timedOut"]:
            raise TransferError(f"{what} timed out in the sandbox.")
        if result["exitCode"] != 0:
            raise TransferError(_failure(what, result, result["stderr"]))
        return result

    async def _run_steps(self, steps: list[sync_steps.Step], scratches: list[Scratch]) -> None:
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

    async def _remove_scratch(self, scratch: Scratch) -> None:
        """One ``exec`` (shielded, bounded, errors swallowed): ``rm -f`` of the scratch file, or
        of the scratch and every ``.part-*`` of it (a glob, so partial parts go too)."""
        command, args = scratch.removal_command()
        with self.cleanup_timeout.scope(), contextlib.suppress(ProviderError):
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


def _new_scratch() -> str:
    return f"{SCRATCH_PREFIX}{uuid.uuid4().hex}"
