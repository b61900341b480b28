"""A sandbox's state dir removal (``SandboxFiles.remove``): it opens up what a guest left
unwritable, but never the shared folder above it, which every other guest traverses."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from provider.emulator.sandbox_fs import SandboxFiles


def test_a_failed_removal_of_the_state_dir_leaves_the_shared_parent_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "sandboxes"
    shared.mkdir()
    shared.chmod(0o711)
    files = SandboxFiles(shared / "sb_1", hostname="sb-1", uid=None)
    files.prepare()
    real_rmtree = shutil.rmtree

    def racing_rmtree(path: Any, onerror: Any = None, **kwargs: Any) -> None:
        # The state dir's own rmdir fails once (a booting guest wrote a file into it).
        onerror(os.rmdir, str(path), None)
        real_rmtree(path, onerror=onerror, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", racing_rmtree)
    files.remove()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o711
    assert not files.state_dir.exists()
