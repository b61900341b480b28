"""environmentSyncIn / environmentSyncOut: move files between host paths and the workspace.

Bytes never cross JSON-RPC: they are streamed through the files API between host temp files
and sandbox scratch files, and a guarded control command moves them into place inside the
sandbox (docs/protocol.md 5). Small ones skip the files API and travel base64 inside that
one command, in its stdin or its output (:mod:`provider.driver.transfer.sync_inline`, issue 22), so
a small sync costs one request each way. This module orchestrates, per mapping, what to pack,
send, place, fetch and clean up; the pieces are
:mod:`provider.driver.transfer.sync_upload` (one inbound mapping: pack, choose its mode, send),
:mod:`provider.driver.transfer.sync_download` (one outbound mapping: pack, fetch, install),
:mod:`provider.driver.transfer.sync_files` (the host side: temp folders, streamed ``PUT``s of byte
ranges of a host file, ``GET``s appended to one host file, the atomic install),
:mod:`provider.driver.transfer.sync_steps` (the one sandbox command of an inbound operation) and
:mod:`provider.driver.transfer.sync_parts` (byte-range parts and the texts that place or pack them).

Large trees and files: the files API takes at most about 500 MiB per file (413 above it), so a
mapping's byte stream (the tar archive of a directory, or a file) larger than ``part_bytes``
(:data:`PART_BYTES`, 256 MiB, by default; a :class:`SyncSession` parameter for tests) travels
as ``<scratch>.part-0000``, ``.part-0001``, ... Inbound, one streamed ``PUT`` per byte range of
the host file, consumed in order by the placement step; at or under the part size, one ``PUT``
of the whole file to the scratch path, exactly as before. Outbound, the pack command always
splits (a small tree is one part) and prints the part count, the host ``GET``s the parts in
order into one host file and validates the whole archive (5.7) before extracting anything.

Request counts: an inbound operation is its one command, plus one ``PUT`` per mapping (or part)
that did not fit the command's inline stdin (:data:`~provider.driver.transfer.sync_inline.
INLINE_IN_CHARS`); an outbound mapping is its pack command alone when the packed bytes are at
most :data:`~provider.driver.transfer.sync_inline.INLINE_OUT_BYTES`, otherwise the pack command, one
``GET`` per part and the cleanup. A failing part upload fails the
sync and the scratch and its parts are removed, a partial download leaves the host target
untouched and no temp file, and cancellation runs the cleanup (a glob over the parts) shielded
and bounded.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio

from provider.createos.client import CreateOSClient
from provider.createos.exec_stream import exec_stream_supported
from provider.driver.commands.execute import CommandResult, CommandSpec, ProcessRecord, run_command
from provider.driver.core.budget import CleanupBound, as_bound
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.process_records import JournaledProcesses
from provider.driver.core.runtime import ROOT
from provider.driver.transfer import archive, sync_files, sync_inline, sync_parts, sync_steps
from provider.driver.transfer.sync_download import download
from provider.driver.transfer.sync_files import LogSink
from provider.driver.transfer.sync_parts import Scratch
from provider.driver.transfer.sync_plan import PlannedOperation
from provider.driver.transfer.sync_upload import upload
from provider.errors import ProviderError, TransferError

PART_BYTES: Final = 256 * 1024 * 1024
"""Largest byte range one PUT or GET of a sync carries (CreateOS takes about 500 MiB a file)."""


@dataclass(frozen=True)
class SyncedOperation:
    """What one sync operation moved; ``skipped``: special files (sockets, FIFOs, devices) an
    inbound directory left out, ``skipped_paths`` the first few of them."""

    operation_id: str | None
    files: int
    transferred: int
    skipped: int = 0
    skipped_paths: list[str] = field(default_factory=list)

    def wire(self) -> dict[str, Any]:
        """The operation's entry in a sync result (skip counts only when something was)."""
        result: dict[str, Any] = {
            "operationId": self.operation_id,
            "filesTransferred": self.files,
            "bytesTransferred": self.transferred,
        }
        if self.skipped:
            result.update(skippedSpecialFiles=self.skipped, skippedPaths=self.skipped_paths)
        return result


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
        scratches: JournaledProcesses | None = None,
        part_bytes: int | None = None,
    ) -> None:
        """``journal`` records host temp folders, ``record`` the sandbox processes (control
        and post-upload commands), ``scratches`` the sandbox scratch files, so a worker crash
        leaves none of them behind for good.
        ``part_bytes`` (default :data:`PART_BYTES`, read when the session is made) is the
        largest byte range one transfer request carries; larger archives and files travel as
        parts (module docstring)."""
        part_bytes = PART_BYTES if part_bytes is None else part_bytes
        if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes < 1:
            raise ValueError("part_bytes must be a positive integer")
        self.part_bytes = part_bytes
        self.inline_in = sync_inline.INLINE_IN_CHARS  # read now: tests lower them
        # Output inline only where commands stream: a managed process's output passes through
        # its 1 MiB journal (an older CreateOS, 3.3), so there it is fetched with GET as before.
        streams = exec_stream_supported(client.base_url)
        self.inline_out = sync_inline.INLINE_OUT_BYTES if streams else 0
        self.client = client
        self.sandbox_id = sandbox_id
        self.cleanup_timeout = as_bound(cleanup_timeout)  # one bound for every cleanup
        self.log = log
        self.journal = journal
        self.record = record
        self.scratches = scratches

    async def new_workdir(self, parent: Path | None) -> Path:
        """A fresh 0700 host temp folder, journaled so a crash cannot leave it behind.

        Made and journaled under a shield: a cancel landing while the thread makes the folder
        (a release cancelling the sync) would otherwise drop the path with the folder made."""
        with anyio.CancelScope(shield=True):
            workdir: Path = await anyio.to_thread.run_sync(sync_files.make_workdir, parent)
            if self.journal is not None:
                try:
                    await anyio.to_thread.run_sync(self.journal.add_tempdir, workdir)
                except BaseException:
                    await anyio.to_thread.run_sync(shutil.rmtree, workdir, True)
                    raise
        return workdir

    async def drop_workdir(self, workdir: Path) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(workdir, ignore_errors=True))
            if self.journal is not None:
                await anyio.to_thread.run_sync(self.journal.remove_tempdir, workdir)

    async def sync_in(self, operations: list[PlannedOperation]) -> list[SyncedOperation]:
        results = []
        for op in operations:
            results.append(await self._sync_in_operation(op))
        return results

    async def _sync_in_operation(self, op: PlannedOperation) -> SyncedOperation:
        """Upload every mapping, then place them and run the post-upload commands in one
        sandbox command (provider.driver.transfer.sync_steps); scratch files left by a failure
        before that command ran are removed here."""
        scratches: list[Scratch] = []
        steps: list[sync_steps.Step] = []
        files = transferred = 0
        skipped = 0
        skipped_paths: list[str] = []
        stdin: list[str] = []  # the inline mappings' bytes, base64, in mapping order
        room = self.inline_in
        placed = False
        try:
            for mapping in op.mappings:
                scratch = Scratch(sync_parts.new_scratch())
                scratches.append(scratch)
                with sync_files.host_errors(f"Reading {mapping.host_path}"):
                    sent = await upload(self, mapping, scratch, room)
                if sent.inline is not None:
                    stdin.append(sent.inline)
                    room -= len(sent.inline)
                steps.append(
                    sync_steps.Step(
                        f"Placing {mapping.sandbox_path}", sent.text, sent.inline is not None
                    )
                )
                files, transferred = files + sent.files, transferred + sent.size
                skipped += sent.stats.skipped
                skipped_paths += [str(mapping.host_path / n) for n in sent.stats.skipped_names]
            for command in op.post_upload:
                budget = command.timeout if command.timeout is not None else math.inf
                remaining = anyio.current_effective_deadline() - anyio.current_time()
                steps += sync_steps.post_upload_steps(
                    command.command, command.cwd, min(budget, remaining)
                )
            if steps:
                for scratch in scratches:  # the inline ones: the command creates them
                    if not scratch.sent:
                        await self.journal_scratch(scratch.path)
                        scratch.sent = True
                await self._run_steps(steps, scratches, "".join(stdin))
            placed = True
        finally:
            for scratch in scratches:  # placed: the operation's EXIT trap removed them
                if scratch.sent:
                    await self.remove_scratch(scratch, done=placed)
        # sockets, FIFOs and devices left out: their count and the first few
        return SyncedOperation(
            op.operation_id, files, transferred, skipped, skipped_paths[: archive.SKIPPED_NAMES]
        )

    async def sync_out(self, operations: list[PlannedOperation]) -> list[SyncedOperation]:
        results = []
        for op in operations:
            files = transferred = 0
            for mapping in op.mappings:
                with sync_files.host_errors(f"Writing {mapping.host_path}"):
                    count, size = await download(self, mapping)
                files, transferred = files + count, transferred + size
            results.append(SyncedOperation(op.operation_id, files, transferred))
        return results

    # -- sandbox commands --------------------------------------------------------------------

    async def control(self, script: str, what: str) -> CommandResult:
        """One control command (docs/protocol.md 5.3); a timeout or non-zero exit fails the
        transfer."""
        result = await self._command(script)
        if result.timed_out:
            raise TransferError(f"{what} timed out in the sandbox.")
        if result.exit_code != 0:
            raise TransferError(_failure(what, result, result.stderr))
        return result

    async def _run_steps(
        self, steps: list[sync_steps.Step], scratches: list[Scratch], stdin: str
    ) -> None:
        """One sandbox command for the steps of an inbound operation, ``stdin`` its inline
        mappings' bytes; errors name the step."""
        result = await self._command(sync_steps.operation_script(steps, scratches), stdin)
        if not result.timed_out and result.exit_code == 0:
            return
        failed = sync_steps.failed_step(steps, result.stderr)
        label = failed.label if failed is not None else "Placing the uploaded files"
        if result.timed_out or (failed is not None and failed.timed_out):
            raise TransferError(f"{label} timed out in the sandbox.")
        detail = failed.detail if failed is not None else result.stderr
        raise TransferError(_failure(label, result, detail))

    async def _command(self, script: str, stdin: str = "") -> CommandResult:
        """``bash -c script`` in ROOT, no live logs (nothing of an inline transfer reaches a
        log), within what is left of the sync deadline."""
        remaining = anyio.current_effective_deadline() - anyio.current_time()
        return await run_command(
            self.client,
            self.sandbox_id,
            CommandSpec(
                command="/bin/bash",
                args=["-c", script],
                cwd=ROOT,
                stdin=stdin or None,
                timeout=max(remaining, 0.001),
            ),
            on_output=None,
            cleanup_timeout=self.cleanup_timeout,
            record=self.record,
            log=self.log,
        )

    async def journal_scratch(self, path: str) -> None:
        """Journal a scratch path before anything can create it, so a crash cannot leave a
        copy of the host files in a kept sandbox for good
        (:mod:`provider.driver.leases.recovery`)."""
        if self.scratches is not None:
            await self.scratches.scratch_added(path)

    async def remove_scratch(self, scratch: Scratch, *, done: bool = False) -> None:
        """One ``exec`` (shielded, bounded, errors swallowed): ``rm -f`` of the scratch file, or
        of the scratch and every ``.part-*`` of it (a glob, so partial parts go too); skipped
        when ``done`` (already removed in the sandbox). Its journal row goes once it is gone."""
        with anyio.CancelScope(shield=True):
            if not done:
                command, args = scratch.removal_command()
                with self.cleanup_timeout.scope(), contextlib.suppress(ProviderError):
                    await self.client.exec(self.sandbox_id, command, args)
                    done = True
            if done and self.scratches is not None:
                await self.scratches.scratch_removed(scratch.path)


def _failure(what: str, result: CommandResult, stderr: str) -> str:
    detail = stderr.strip()[-300:]
    code = result.exit_code if result.exit_code is not None else result.signal
    return f"{what} failed in the sandbox (exit {code})" + (f": {detail}" if detail else ".")
