"""Sync out of one mapping (:class:`provider.driver.transfer.sync.SyncSession` runs it): pack in the
sandbox into parts, ``GET`` every part into one host file (each must bring exactly the bytes
the pack step counted), then install the file or validate and extract the archive (docs/protocol.md
5.6). A pack result of at most the session's ``inline_out`` bytes comes back in the pack command's
own output instead, and the pack command removes its scratch (:mod:`provider.driver.
sync_inline`): one request for the whole mapping, and the same checks before anything is
installed.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from provider.driver.transfer import sync_files, sync_inline, sync_parts
from provider.driver.transfer.archive import extract_archive
from provider.driver.transfer.sync_mapping import MappingSession
from provider.driver.transfer.sync_parts import Scratch
from provider.driver.transfer.sync_plan import FileMapping
from provider.errors import TransferError


async def download(session: MappingSession, mapping: FileMapping) -> tuple[int, int]:
    """Pack in the sandbox (into parts), GET every part into one host file, then install
    it (file) or validate and extract it (directory)."""
    scratch = sync_parts.new_scratch()
    await session.journal_scratch(scratch)
    target = mapping.host_path
    if mapping.kind == "directory":
        script = sync_parts.syncout_dir_parts_command(
            mapping.sandbox_path,
            scratch,
            session.part_bytes,
            exclude=mapping.exclude,
            follow_symlinks=mapping.follow_symlinks,
            inline_bytes=session.inline_out,
        )
    else:
        script = sync_parts.syncout_file_parts_command(
            mapping.sandbox_path, scratch, session.part_bytes, session.inline_out
        )
    file_mode = 0o600 if mapping.mode is None else mapping.mode
    workdir: Path | None = None
    parents: list[Path] = []
    installed = scratch_gone = False
    try:
        what = f"Packing {mapping.sandbox_path}"
        packed = await session.control(script, what)
        try:
            inline = sync_inline.parse_inline(packed.stdout, session.inline_out)
            sizes = [] if inline is not None else sync_parts.parse_part_sizes(packed.stdout)
        except ValueError as exc:
            raise TransferError(f"{what} failed in the sandbox: {exc}.") from None
        scratch_gone = inline is not None  # the pack command removed it
        with anyio.CancelScope(shield=True):  # a cancel here must not lose what was made
            parents = await anyio.to_thread.run_sync(sync_files.make_dirs, target.parent)
        workdir = await session.new_workdir(target.parent)
        data = workdir / "data"
        if inline is not None:
            size = len(inline)
            await anyio.to_thread.run_sync(sync_files.write_new, data, inline, file_mode)
        else:
            size = await sync_files.get_to_file(
                session.client,
                session.sandbox_id,
                [(sync_parts.part_path(scratch, index), n) for index, n in enumerate(sizes)],
                data,
                file_mode,
                log=session.log,
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
            await session.drop_workdir(workdir)
        if not installed and parents:  # a failed sync leaves no new empty folders
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(sync_files.remove_new_dirs, parents)
        await session.remove_scratch(Scratch(scratch, parts=1), done=scratch_gone)
