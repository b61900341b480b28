"""Validation of a whole sync batch before any side effect (docs/protocol.md 5.2).

``plan_sync`` checks every operation and mapping (kinds, absolute host paths, modes, confined
sandbox paths, post-upload commands) and, for inbound directories with ``followSymlinks``, walks
the source for escaping links. Only when the whole batch passes does anything get uploaded,
downloaded or run. The result is a list of typed, normalized steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio

from provider.driver.commands.execute import timeout_seconds
from provider.driver.commands.sandbox_text import confine_sandbox_path
from provider.driver.core.params import SyncMapping, SyncOperation
from provider.driver.core.runtime import ROOT
from provider.driver.transfer.archive import check_follow_symlinks
from provider.errors import InvalidParams, RequestRefused

Direction = Literal["in", "out"]


@dataclass(frozen=True)
class FileMapping:
    host_path: Path
    sandbox_path: str
    kind: Literal["file", "directory"]
    mode: int | None
    exclude: tuple[str, ...]
    follow_symlinks: bool


@dataclass(frozen=True)
class PostUpload:
    command: str
    cwd: str
    timeout: float | None


@dataclass(frozen=True)
class PlannedOperation:
    operation_id: str | None
    mappings: tuple[FileMapping, ...]
    post_upload: tuple[PostUpload, ...]


async def plan_sync(
    operations: list[SyncOperation], direction: Direction
) -> list[PlannedOperation]:
    planned = [_plan_operation(op, direction, index) for index, op in enumerate(operations)]
    if direction == "in":
        for op in planned:
            for mapping in op.mappings:
                if mapping.kind == "directory" and mapping.follow_symlinks:
                    await anyio.to_thread.run_sync(_check_links, mapping)
    return planned


def _check_links(mapping: FileMapping) -> None:
    check_follow_symlinks(mapping.host_path, exclude=mapping.exclude)


def _plan_operation(op: SyncOperation, direction: Direction, index: int) -> PlannedOperation:
    where = f"operation {op.operationId or index}"
    mappings = tuple(_plan_mapping(m, direction, where) for m in op.files)
    commands = op.postUploadCommands or []
    if direction == "out" and commands:
        raise RequestRefused(f"Sync out does not run post-upload commands ({where}).")
    post = tuple(_plan_command(c.command, c.cwd, c.timeoutMs, where) for c in commands)
    return PlannedOperation(op.operationId, mappings, post)


def _plan_mapping(mapping: SyncMapping, direction: Direction, where: str) -> FileMapping:
    if mapping.kind not in ("file", "directory"):
        raise InvalidParams(
            f"A file mapping in {where} has an unknown kind; use file or directory."
        )
    host, sandbox = (
        (mapping.sourcePath, mapping.targetPath)
        if direction == "in"
        else (mapping.targetPath, mapping.sourcePath)
    )
    if "\0" in host or not Path(host).is_absolute():
        raise RequestRefused(f"The host path of a mapping in {where} must be an absolute path.")
    mode = mapping.mode
    if mode is not None and (isinstance(mode, bool) or not 0 <= mode <= 0o777):
        raise InvalidParams(f"The mode of a mapping in {where} must be an integer from 0 to 0o777.")
    exclude = tuple(mapping.exclude or ())
    if any("\0" in pattern for pattern in exclude):
        raise InvalidParams(f"An exclusion pattern in {where} contains a NUL character.")
    return FileMapping(
        host_path=Path(host),
        sandbox_path=confine_sandbox_path(sandbox),
        kind="file" if mapping.kind == "file" else "directory",
        mode=mode,
        exclude=exclude,
        follow_symlinks=bool(mapping.followSymlinks),
    )


def _plan_command(command: str, cwd: str | None, timeout_ms: object, where: str) -> PostUpload:
    if not command or "\0" in command:
        raise InvalidParams(f"A post-upload command in {where} is empty or contains NUL.")
    timeout = None
    if timeout_ms is not None:
        timeout = timeout_seconds(timeout_ms, f"The timeoutMs of a post-upload command in {where}")
    return PostUpload(command, confine_sandbox_path(cwd or ROOT), timeout)
