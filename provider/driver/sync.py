"""environmentSyncIn / environmentSyncOut: move files between host paths and the workspace.

Bytes never cross JSON-RPC and never go through process output: they are streamed through the
files API between host temp files and sandbox scratch files, and a guarded control command
(provider.driver.shell) moves them into place inside the sandbox. See provider-behavior.md 5.
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
from typing import Any

import anyio

from provider.createos.client import CreateOSClient
from provider.driver import shell, sync_steps
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
    ) -> None:
        """``journal`` records host temp folders, ``record`` the sandbox processes (control
        and post-upload commands), so a worker crash leaves neither behind for good."""
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
        scratches: list[str] = []
        steps: list[sync_steps.Step] = []
        files = transferred = 0
        placed = False
        try:
            for mapping in op.mappings:
                scratch = f"/tmp/paperclip-createos-transfer-{uuid.uuid4().hex}"
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

    async def _upload(self, mapping: FileMapping, scratch: str) -> tuple[int, int, str]:
        """PUT one mapping to ``scratch``; answers (files, bytes, the placement text)."""
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
            await self._put_with_progress(scratch, data, size, mapping)
        finally:
            await self._drop_workdir(workdir)
        if mapping.kind == "directory":
            text = shell.syncin_dir_command(scratch, mapping.sandbox_path, mode)
        else:
            text = shell.syncin_file_command(scratch, mapping.sandbox_path, mode)
        return files, size, text

    async def _put_with_progress(
        self, scratch: str, data: Path, size: int, mapping: FileMapping
    ) -> None:
        sent = 0

        def progress(count: int) -> None:
            nonlocal sent
            sent = count

        if size <= PROGRESS_THRESHOLD or self.log is None:
            await self.client.put_file(self.sandbox_id, scratch, data)
            return
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._report, lambda: sent, size, f"Uploading {mapping.sandbox_path}")
                await self.client.put_file(self.sandbox_id, scratch, data, on_progress=progress)
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
        scratch = f"/tmp/paperclip-createos-transfer-{uuid.uuid4().hex}"
        target = mapping.host_path
        if mapping.kind == "directory":
            script = shell.syncout_dir_command(
                mapping.sandbox_path,
                scratch,
                exclude=mapping.exclude,
                follow_symlinks=mapping.follow_symlinks,
            )
        else:
            script = shell.syncout_file_command(mapping.sandbox_path, scratch)
        file_mode = 0o600 if mapping.mode is None else mapping.mode
        workdir: Path | None = None
        try:
            await self._control(script, f"Packing {mapping.sandbox_path}")
            parents = await anyio.to_thread.run_sync(_make_parents, target.parent)
            workdir = await self._new_workdir(target.parent)
            data = workdir / "data"
            size = await self._get_to_file(scratch, data, file_mode, mapping)
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
            await self._remove_scratch(scratch)

    async def _get_to_file(self, scratch: str, data: Path, mode: int, mapping: FileMapping) -> int:
        fd = await anyio.to_thread.run_sync(
            lambda: os.open(data, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode & 0o600)
        )
        size = reported = 0
        pending: list[bytes] = []
        pending_size = 0
        try:
            async with self.client.get_file(self.sandbox_id, scratch) as body:
                async for chunk in body:
                    pending.append(chunk)
                    pending_size += len(chunk)
                    if pending_size >= WRITE_BATCH:
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

    async def _control(self, script: str, what: str) -> None:
        """One control command (spec 5.3); a timeout or non-zero exit fails the transfer."""
        result = await self._command(script)
        if result["timedOut"]:
            raise TransferError(f"{what} timed out in the sandbox.")
        if result["exitCode"] != 0:
            raise TransferError(_failure(what, result, result["stderr"]))

    async def _run_steps(self, steps: list[sync_steps.Step], scratches: list[str]) -> None:
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

    async def _remove_scratch(self, scratch: str) -> None:
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(self.cleanup_timeout),
            contextlib.suppress(ProviderError),
        ):
            await self.client.exec(self.sandbox_id, "/bin/rm", ["-f", "--", scratch])


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
