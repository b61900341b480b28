"""What one mapping's upload (:mod:`provider.driver.transfer.sync_upload`) or download
(:mod:`provider.driver.transfer.sync_download`) uses of the sync session that runs it.

:class:`provider.driver.transfer.sync.SyncSession` is the one implementation; this protocol lets
the two mapping modules sit below it (they used to import it back, under ``TYPE_CHECKING``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from provider.createos.client import CreateOSClient
from provider.driver.commands.command_types import CommandResult
from provider.driver.transfer.sync_files import LogSink
from provider.driver.transfer.sync_parts import Scratch


class MappingSession(Protocol):
    client: CreateOSClient
    sandbox_id: str
    part_bytes: int  # largest byte range one PUT or GET carries
    inline_out: int  # outbound pack results up to this many bytes come back in the command
    log: LogSink | None

    async def new_workdir(self, parent: Path | None) -> Path: ...

    async def drop_workdir(self, workdir: Path) -> None: ...

    async def control(self, script: str, what: str) -> CommandResult: ...

    async def journal_scratch(self, path: str) -> None: ...

    async def remove_scratch(self, scratch: Scratch, *, done: bool = False) -> None: ...
