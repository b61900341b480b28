"""Moving a staged sync-out tree into its host target by rename only, undone on failure.

:mod:`provider.driver.transfer.archive_extract` stages the archive in a private folder on the
target's filesystem; this module puts it in place:

- a target that does not exist yet is the staged folder itself, renamed: one atomic step;
- into an existing target the staged tree is merged, directory by directory, through
  descriptors opened with ``O_NOFOLLOW`` (never through a symlink): an entry the target lacks
  is renamed in whole (a new subtree moves in one step); an entry the target has is replaced by
  a rename over it after the old one is kept aside (hard-linked, or renamed when the
  filesystem has no hard links, into the ``replaced`` folder); a directory present on both
  sides is merged into, and gets the archived mtime afterwards (its mode is kept, as the
  ``data`` filter keeps it). A directory of the archive where the target holds a file or a
  symlink, or the reverse, stops the install (nothing is followed or deleted to make room).

Every step is recorded; when one fails (a read-only folder, a file in the way, a full disk),
the steps done are undone in reverse (moved entries go back to staging, kept entries are
renamed back over the new ones, directory times restored) and the error names the step and
the path. If the undo itself fails (the filesystem refuses a rename it just allowed), the
error says the target may be partly updated. The existing target keeps its inode and mode
(unless the mapping gives one), and files outside the archive are never touched.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from provider.errors import TransferError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_Key = tuple[str, ...]


@dataclass(frozen=True)
class _Moved:
    """A staged entry moved to ``target/parent/name``; undone by moving it back."""

    parent: _Key
    name: str


@dataclass(frozen=True)
class _Replaced:
    """The target's old ``parent/name``, kept as ``replaced/backup``; undone by renaming it back."""

    parent: _Key
    name: str
    backup: str


@dataclass(frozen=True)
class _Dated:
    """An existing target directory about to get the archived times; undone by restoring."""

    key: _Key
    times: tuple[int, int]


class _InTheWay(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@contextmanager
def _opened(root: int | Path, key: _Key = ()) -> Iterator[int]:
    """A descriptor of ``root/key``, opened component by component without following links."""
    fd = os.open(root, _DIR) if isinstance(root, Path) else os.dup(root)
    try:
        for part in key:
            child = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def install_tree(staged: Path, target: Path, replaced: Path, *, mode: int | None) -> None:
    """Move the tree at ``staged`` into ``target`` (module docstring), then give the target
    ``mode`` when one is given. ``replaced`` is a path on the same filesystem that does not
    exist yet (it holds the replaced entries until the caller removes it)."""
    if not os.path.lexists(target):
        try:
            staged.rename(target)
        except OSError as exc:
            raise _failure(target, exc.strerror or str(exc), target, None) from exc
        try:
            if mode is not None:
                target.chmod(mode, follow_symlinks=False)
        except OSError as exc:
            undo_error = _undo_rename(target, staged)
            raise _failure(target, exc.strerror or str(exc), target, undo_error) from exc
        return
    _Install(staged, target, replaced).run(mode)


def _undo_rename(moved: Path, back: Path) -> OSError | None:
    try:
        moved.rename(back)
    except OSError as exc:
        return exc
    return None


class _Install:
    def __init__(self, staged: Path, target: Path, replaced: Path) -> None:
        self.staged, self.target, self.replaced = staged, target, replaced
        self.done: list[_Moved | _Replaced | _Dated] = []
        self.at: _Key = ()

    def run(self, mode: int | None) -> None:
        with ExitStack() as stack:
            try:
                self.replaced.mkdir(mode=0o700)
                sfd, tfd, self.rfd = (
                    stack.enter_context(_opened(path))
                    for path in (self.staged, self.target, self.replaced)
                )
                self._merge((), sfd, tfd)
                if mode is not None:
                    os.fchmod(tfd, mode)
            except (OSError, _InTheWay) as exc:
                reason = exc.what if isinstance(exc, _InTheWay) else exc.strerror or str(exc)
                undo_error = self._undo(sfd, tfd) if self.done else None
                where = self.target.joinpath(*self.at)
                raise _failure(self.target, reason, where, undo_error) from exc

    def _merge(self, key: _Key, sfd: int, tfd: int) -> None:
        archived = os.fstat(sfd)  # read before moving entries out changes it
        old = os.fstat(tfd)
        self.done.append(_Dated(key, (old.st_atime_ns, old.st_mtime_ns)))
        for name in sorted(os.listdir(sfd)):
            self.at = (*key, name)
            new = os.stat(name, dir_fd=sfd, follow_symlinks=False)
            try:
                there = os.stat(name, dir_fd=tfd, follow_symlinks=False)
            except FileNotFoundError:
                os.rename(name, name, src_dir_fd=sfd, dst_dir_fd=tfd)
                self.done.append(_Moved(key, name))
                continue
            new_dir, there_dir = stat.S_ISDIR(new.st_mode), stat.S_ISDIR(there.st_mode)
            if new_dir and there_dir:
                with _opened(sfd, (name,)) as child_s, _opened(tfd, (name,)) as child_t:
                    self._merge(self.at, child_s, child_t)
            elif new_dir:
                raise _InTheWay("a file or symbolic link is where the archive has a directory")
            elif there_dir:
                raise _InTheWay("a directory is where the archive has a file or link")
            else:
                backup = str(len(self.done))
                try:
                    os.link(
                        name, backup, src_dir_fd=tfd, dst_dir_fd=self.rfd, follow_symlinks=False
                    )
                except OSError:  # no hard links here: move it aside instead
                    os.rename(name, backup, src_dir_fd=tfd, dst_dir_fd=self.rfd)
                self.done.append(_Replaced(key, name, backup))
                os.rename(name, name, src_dir_fd=sfd, dst_dir_fd=tfd)
        os.utime(tfd, ns=(archived.st_atime_ns, archived.st_mtime_ns))

    def _undo(self, staged_fd: int, target_fd: int) -> OSError | None:
        """Undo every recorded step, newest first; answers the first error (all are tried)."""
        first: OSError | None = None
        for step in reversed(self.done):
            try:
                if isinstance(step, _Dated):
                    with _opened(target_fd, step.key) as fd:
                        os.utime(fd, ns=step.times)
                    continue
                with _opened(target_fd, step.parent) as tfd:
                    if isinstance(step, _Replaced):
                        os.rename(step.backup, step.name, src_dir_fd=self.rfd, dst_dir_fd=tfd)
                    else:
                        with _opened(staged_fd, step.parent) as sfd:
                            os.rename(step.name, step.name, src_dir_fd=tfd, dst_dir_fd=sfd)
            except OSError as exc:
                first = first or exc
        return first


def _failure(target: Path, reason: str, where: Path, undo_error: OSError | None) -> TransferError:
    head = f"Installing into {target} failed on the host: {reason} ({where})"
    if undo_error is None:
        return TransferError(f"{head}; the target was left as it was.")
    undo = undo_error.strerror or str(undo_error)
    return TransferError(
        f"{head}; undoing it failed too ({undo}), so {target} may be partly updated."
    )
