"""Helpers for the tests that run the driver's shell texts in real bash."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

BASH = "/usr/bin/bash"


def run_bash(
    script: str, *, env: Mapping[str, str] | None = None, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """Run the wrapper with ``stdin`` on its stdin, then EOF (which opens the start gate)."""
    return subprocess.run(
        [BASH, "-c", script], capture_output=True, timeout=60, env=env, input=stdin
    )


def make_tree(tmp_path: Path) -> Path:
    """tmp/ws (the root) with sub/, link-out -> ../outside, link-in -> sub, abs-out ->
    tmp/outside/secret (absolute); tmp/ws-other/; answers the root."""
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("s")
    (tmp_path / "ws-other").mkdir()
    (root / "link-out").symlink_to("../outside")
    (root / "link-in").symlink_to("sub")
    (root / "abs-out").symlink_to(tmp_path / "outside" / "secret")
    return root
