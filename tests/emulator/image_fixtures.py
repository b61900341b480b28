"""Image folders for the rootfs-image tests: a fake agent CLI under /opt and /usr/local/bin."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import pytest

from provider.emulator import BwrapUnavailable, Emulator
from provider.emulator.bwrap import probe_runtime

TOOL = "paperclip-image-test-tool"  # a name no host has in /usr/local/bin
AGENT = "/opt/paperclip-image-test/bin/agent"


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@contextmanager
def image_folder() -> Iterator[Path]:
    """A folder image under the system temp dir (reachable by the guest uid), removed after.

    Holds ``usr/local/bin/TOOL``, a symlink next to it, ``opt/.../bin/agent`` with a symlink
    and a data file, and ``usr/share/paperclip-image-test/notes.txt``.
    """
    root = Path(tempfile.mkdtemp(prefix="createos-image-test-"))
    try:
        root.chmod(0o755)
        _script(root / "usr/local/bin" / TOOL, '#!/bin/sh\necho "tool says $*"\n')
        (root / "usr/local/bin" / f"{TOOL}-link").symlink_to(TOOL)
        agent = root / AGENT.lstrip("/")
        _script(agent, '#!/bin/sh\necho "agent $(id -u) $*"\n')
        (agent.parent / "agent-link").symlink_to("agent")
        (agent.parent.parent / "VERSION").write_text("1.2.3\n")
        share = root / "usr/share/paperclip-image-test"
        share.mkdir(parents=True)
        (share / "notes.txt").write_text("notes\n")
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def tree_digest(root: Path) -> dict[str, tuple[int, str]]:
    """Relative path -> (mode, sha256 of the content or the link target) of every entry."""
    out: dict[str, tuple[int, str]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if path.is_symlink():
            body = str(path.readlink()).encode()
        elif path.is_file():
            body = path.read_bytes()
        else:
            body = b""
        out[str(path.relative_to(root))] = (info.st_mode, hashlib.sha256(body).hexdigest())
    return out


@asynccontextmanager
async def image_emulator(images: Mapping[str, Path]) -> AsyncIterator[Emulator]:
    """An emulator with ``images``; skips without bwrap, checks for leaks after."""
    try:
        await anyio.to_thread.run_sync(probe_runtime)
    except BwrapUnavailable as exc:
        pytest.skip(str(exc))
    emu = Emulator(api_keys=["test-key"], images=images)
    async with emu:
        yield emu
    assert emu.leaked_host_pids() == []
