"""A sync's sandbox commands within the one-argument bound, checked before any request.

Outbound, each mapping is packed by one command whose text holds its sandbox path and its
exclusion patterns (:mod:`provider.driver.transfer.sync_parts`); inbound, one command per operation
holds the placement of every mapping and the post-upload commands
(:mod:`provider.driver.transfer.sync_steps`). Each runs as an execute of ``bash -c TEXT``, so each
must fit the bound of
:mod:`provider.driver.commands.command_size`. :func:`check_sync_sizes` builds every such command as
it will be sent, with the widest value of what is known only later (scratch names have a fixed
length; a part count and a timeout take their largest values), and refuses an operation that
cannot fit, naming the largest input, before anything is uploaded or packed.
"""

from __future__ import annotations

from collections.abc import Sequence

from provider.driver.commands.command_size import check_script
from provider.driver.commands.execute import MAX_TIMEOUT_MS, CommandSpec, build_command
from provider.driver.core.runtime import ROOT
from provider.driver.transfer import sync_parts, sync_steps
from provider.driver.transfer.sync import PART_BYTES
from provider.driver.transfer.sync_parts import SCRATCH_PREFIX, Scratch
from provider.driver.transfer.sync_plan import Direction, FileMapping, PlannedOperation

_WIDEST_SCRATCH = SCRATCH_PREFIX + "f" * 32  # uuid4().hex, as sync_parts.new_scratch names them
_LONGEST_S = MAX_TIMEOUT_MS // 1000  # no sync deadline is longer (timeoutMs of the config)


def check_sync_sizes(operations: Sequence[PlannedOperation], direction: Direction) -> None:
    """Raise InvalidParams for the first sandbox command of the batch that cannot fit."""
    for index, op in enumerate(operations):
        where = f"operation {op.operation_id or index}"
        if direction == "out":
            for number, mapping in enumerate(op.mappings):
                _check(
                    _pack_text(mapping),
                    f"Packing files[{number}] of {where}",
                    _mapping_inputs(number, mapping),
                    "Exclude a parent folder instead of its many entries, or sync less at once.",
                )
            continue
        steps: list[sync_steps.Step] = []
        scratches: list[Scratch] = []
        inputs: list[tuple[str, str]] = []
        for number, mapping in enumerate(op.mappings):
            steps.append(sync_steps.Step("", _widest_placement(mapping)))
            scratches.append(Scratch(_WIDEST_SCRATCH, parts=sync_parts.MAX_PARTS))
            inputs.append((f"the sandbox path of files[{number}]", mapping.sandbox_path))
        for number, command in enumerate(op.post_upload):
            steps += sync_steps.post_upload_steps(command.command, command.cwd, _LONGEST_S)
            inputs.append((f"postUploadCommands[{number}].command", command.command))
            inputs.append((f"postUploadCommands[{number}].cwd", command.cwd))
        if steps:
            _check(
                sync_steps.operation_script(steps, scratches),
                f"The sandbox command of {where} (placement and post-upload commands)",
                inputs,
                "Put a long post-upload script in a file synced in, and run that file.",
            )


def _check(text: str, what: str, inputs: list[tuple[str, str]], advice: str) -> None:
    """``text`` as run_command will send it (inside the execute wrapper), within the bound."""
    spec = CommandSpec(command="/bin/bash", args=["-c", text], cwd=ROOT, timeout=_LONGEST_S)
    check_script(build_command(spec).script, what, inputs, advice)


def _pack_text(mapping: FileMapping) -> str:
    if mapping.kind == "directory":
        return sync_parts.syncout_dir_parts_command(
            mapping.sandbox_path,
            _WIDEST_SCRATCH,
            PART_BYTES,
            exclude=mapping.exclude,
            follow_symlinks=mapping.follow_symlinks,
        )
    return sync_parts.syncout_file_parts_command(mapping.sandbox_path, _WIDEST_SCRATCH, PART_BYTES)


def _widest_placement(mapping: FileMapping) -> str:
    """The longer placement text: from the one scratch file, or from the most parts."""
    mode = 0o777 if mapping.mode is None else mapping.mode
    scratches = (Scratch(_WIDEST_SCRATCH, parts) for parts in (0, sync_parts.MAX_PARTS))
    texts = (
        sync_parts.placement_text(scratch, mapping.kind, mapping.sandbox_path, mode)
        for scratch in scratches
    )
    return max(texts, key=len)


def _mapping_inputs(number: int, mapping: FileMapping) -> list[tuple[str, str]]:
    return [
        (f"the sandbox path of files[{number}]", mapping.sandbox_path),
        *((f"exclude[{k}] of files[{number}]", p) for k, p in enumerate(mapping.exclude)),
    ]
