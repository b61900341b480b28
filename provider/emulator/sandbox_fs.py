"""A sandbox's host-side files: its state dir, the three guest trees, the fork copy, removal.

Each sandbox owns ``<data-dir>/sandboxes/<id>/``: ``fs/`` holds the trees bound writable into the
guest (``/paperclip-workspace``, ``/tmp``, ``/root``), ``etc/`` the synthetic ``/etc`` and
``supervisor.log`` the supervisor's stderr. A fork copies the source's trees into the child's
(``cp -a``, as the guest uid on root hosts) while both are *held*: removing either state dir and
thawing a resumed source wait until no copy uses the trees (:meth:`SandboxFiles.wait_free`), so
a child never holds a half copy and a copy never reads a tree that is changing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio

from .bwrap import HOME_BIN, write_guest_etc

GUEST_TREES = ("paperclip-workspace", "tmp", "root")


class SandboxFiles:
    """The state dir of one sandbox and the count of fork copies using its guest trees."""

    def __init__(self, state_dir: Path, *, hostname: str, uid: int | None) -> None:
        self.state_dir = state_dir
        self.hostname = hostname  # written into the synthetic /etc
        self.uid = uid  # host uid owning the guest trees (root hosts), None = current user
        self._holds = 0  # fork copies reading (source) or writing (child) the guest trees
        self._free = anyio.Event()
        self._free.set()

    @property
    def fs_dir(self) -> Path:
        return self.state_dir / "fs"

    @property
    def etc_dir(self) -> Path:
        return self.state_dir / "etc"

    def prepare(self, *, seed_home: bool = True) -> None:
        """Create the state dir and the guest trees (blocking); a freshly created HOME gets an
        empty ``.local/bin`` (first on the login ``PATH``) unless ``seed_home`` is false (a fork
        target, whose HOME is copied from its source)."""
        uid = self.uid
        for path in (self.state_dir, self.fs_dir):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o711)
        for tree in GUEST_TREES:
            path = self.fs_dir / tree
            fresh = not path.exists()
            path.mkdir(exist_ok=True)
            path.chmod(0o700)
            if uid is not None:
                os.chown(path, uid, uid)
            if tree == "root" and fresh and seed_home:
                # Only into a tree just made: the guest cannot have planted a symlink yet.
                _guest_mkdirs(path, HOME_BIN, uid)
        write_guest_etc(self.etc_dir, self.hostname)

    def copy_to(self, other: SandboxFiles) -> None:
        """Copy the guest trees into ``other`` (blocking; run as the guest uid on root hosts)."""
        other.prepare(seed_home=False)
        kwargs: dict[str, Any] = {}
        uid = self.uid
        if uid is not None:
            kwargs = {"user": uid, "group": uid, "extra_groups": []}
        for tree in GUEST_TREES:
            src, dst = self.fs_dir / tree, other.fs_dir / tree
            subprocess.run(
                ["cp", "-a", "--", f"{src}/.", f"{dst}/"],
                check=True,
                capture_output=True,
                **kwargs,
            )

    def remove(self) -> None:
        """Delete the state dir (blocking; run in a thread)."""

        def onerror(func: Any, path: str, _exc: Any) -> None:
            # A guest may have left a tree unwritable: open it up and retry, but never the
            # shared folder above the state dir (every other sandbox's guest traverses it).
            target = Path(path)
            with contextlib.suppress(OSError):
                if target != self.state_dir:
                    target.parent.chmod(0o700)
                target.chmod(0o700)
                func(path)

        if self.state_dir.exists():
            shutil.rmtree(self.state_dir, onerror=onerror)

    # -- fork copy holds -----------------------------------------------------------------
    def hold(self) -> None:
        """A fork copy starts using these trees (see :meth:`wait_free`)."""
        if self._holds == 0:
            self._free = anyio.Event()
        self._holds += 1

    def release(self) -> None:
        self._holds -= 1
        if self._holds == 0:
            self._free.set()

    async def wait_free(self) -> None:
        """Until no fork copy uses the trees (state removal and the thaw of a resume wait)."""
        await self._free.wait()


def _guest_mkdirs(base: Path, relative: str, uid: int | None) -> None:
    """``mkdir -p base/relative`` (mode 0755), each new directory owned by the guest uid."""
    path = base
    for part in Path(relative).parts:
        path = path / part
        path.mkdir(exist_ok=True)
        path.chmod(0o755)  # whatever the umask
        if uid is not None:
            os.chown(path, uid, uid, follow_symlinks=False)
