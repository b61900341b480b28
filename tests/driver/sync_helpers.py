"""Helpers for the sync tests on the driver harness: operations, mappings, calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devtools.call_params import bash
from tests.driver.conftest import Harness

WS = "/paperclip-workspace"
SCRATCH = "paperclip-createos-transfer-"


async def sync_in(h: Harness, lease: dict[str, Any], *ops: dict[str, Any]) -> Any:
    return await h.methods.sync_in({**h.with_lease(lease), "operations": list(ops)})


async def sync_out(h: Harness, lease: dict[str, Any], *ops: dict[str, Any]) -> Any:
    return await h.methods.sync_out({**h.with_lease(lease), "operations": list(ops)})


def op(
    *files: dict[str, Any], op_id: str = "op-1", post: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = {"operationId": op_id, "files": list(files)}
    if post is not None:
        result["postUploadCommands"] = post
    return result


def mapping(
    source: str | Path, target: str | Path, kind: str = "file", **extra: Any
) -> dict[str, Any]:
    return {"sourcePath": str(source), "targetPath": str(target), "kind": kind, **extra}


async def sh(h: Harness, lease: dict[str, Any], script: str) -> dict[str, Any]:
    result: dict[str, Any] = await h.methods.execute(bash(h.with_lease(lease), script))
    return result


async def no_scratch(h: Harness, lease: dict[str, Any]) -> None:
    """No sync scratch (nor a half-written upload of the files API) is left in the sandbox."""
    listing = await sh(h, lease, "ls -a /tmp")
    assert SCRATCH not in listing["stdout"] and ".createos-upload-" not in listing["stdout"]


def host_temp_leftovers(*dirs: Path) -> list[str]:
    return [
        p.name
        for d in dirs
        if d.exists()
        for p in d.iterdir()
        if p.name.startswith(".paperclip-createos-")
    ]
