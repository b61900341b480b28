"""Helpers for the tests that run the worker under the real Paperclip worker manager."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from devtools.host_peer import REPO_ROOT

CALL_TIMEOUT_MS = 120_000  # generous: every worker request waits its 300 ms turn
DROPPED_LOG = "dropping execute.log notification"


@dataclass
class LogSink:
    """An ``onLog`` sink: what the manager delivered for one call, in arrival order."""

    chunks: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, stream: str, chunk: str) -> None:
        self.chunks.append((stream, chunk))

    def text(self, stream: str) -> str:
        return "".join(chunk for s, chunk in self.chunks if s == stream)


def package_copy(tmp_path: Path) -> Path:
    """A copy of the files the host reads, with the worker still run from this checkout."""
    root = tmp_path / "pkg"
    root.mkdir()
    for name in ("package.json", "manifest.js", "manifest.json", "shim.mjs"):
        shutil.copy(REPO_ROOT / name, root / name)
    (root / "provider").symlink_to(REPO_ROOT / "provider")
    (root / ".venv").symlink_to(REPO_ROOT / ".venv")
    return root


def streaming_package(tmp_path: Path) -> Path:
    """A package copy whose worker is ``tests/host/streaming_worker.py`` (scripted output)."""
    root = package_copy(tmp_path)
    (root / "provider").unlink()
    (root / "provider").mkdir()
    (root / "provider" / "__init__.py").write_text(
        f"__path__.append({str(REPO_ROOT / 'provider')!r})\n"
    )
    shutil.copy(Path(__file__).with_name("streaming_worker.py"), root / "provider" / "__main__.py")
    return root
