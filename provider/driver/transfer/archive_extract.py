"""Sync-out extraction: a validated archive into the host target, on every CPython 3.11+.

``tarfile``'s ``data`` filter arrived in 3.11.4 (Debian 12's Python is 3.11.2), so extraction
does not use ``extractall`` at all: one code path, ours, on every Python. It runs in two phases.

1. **Stage.** The archive is validated whole first (:func:`open_validated`, docs/protocol.md 5.7: no
   absolute or ``..`` name, no member below a link or a file, no device, FIFO or sparse
   member; a symlink's target is kept as text, even an absolute one, as nothing follows it).
   Then each checked member is created in a private staging folder next to the target (the
   sync's journaled 0700 temp folder, on the target's filesystem): directories with the
   default mode (as the ``data`` filter: archived directory modes are ignored), regular files
   created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``), their bytes streamed and their mode
   sanitised as the ``data`` filter does (:func:`file_mode`), symlinks with their checked text,
   hard links to the staged earlier member; mtimes as archived. Owners are never set. The
   target is not touched in this phase, so any failure here (a full disk, an unreadable
   archive) leaves it as it was.
2. **Install** (:mod:`provider.driver.transfer.archive_install`): the staged tree moves into the
target
   by ``rename`` only, never through a link; a failure undoes what was moved.

Every entry that lands is therefore a new inode created by us: nothing is written through a
symlink or a hard link already in the target.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from provider.driver.transfer.archive_check import COPY_BUFFER, ValidatedArchive, open_validated
from provider.driver.transfer.archive_install import install_tree
from provider.driver.transfer.sync_files import make_dirs, remove_new_dirs
from provider.errors import TransferError

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_KEPT = "; the target was left as it was."
_T = TypeVar("_T")
_PREFIX = ".paperclip-createos-"


def file_mode(archived: int) -> int:
    """The mode of a regular file (or hard link) as tarfile's ``data`` filter sets it: no
    setuid, setgid or sticky bit and no group/other write; no execute bit at all unless the
    owner's; owner read and write always."""
    mode = archived & 0o755
    if not mode & 0o100:
        mode &= ~0o111
    return mode | 0o600


def extract_archive(
    archive: Path, target_dir: Path, *, mode: int | None, workdir: Path | None = None
) -> int:
    """Validate the whole archive, then extract it into ``target_dir`` (docs/protocol.md 5.6 step
    4).

    Nothing is created for a refused archive. A target that is a symlink (or not a directory) is
    refused. Missing directories up to the target are created with ``mode`` (0o700 when None);
    the target gets ``mode`` when one is given. ``workdir`` is a private folder on the target's
    filesystem for the staged tree (one is made next to the target, and removed, when None).
    On any failure the target is left as it was (see :mod:`provider.driver.transfer.archive_install`
    for the one exception) and the error names the step and the path. Returns the
    regular-member count.
    """
    with open_validated(archive) as checked:
        if target_dir.is_symlink():
            raise TransferError(f"the sync target {target_dir} is a symbolic link; refused")
        if target_dir.exists() and not target_dir.is_dir():
            raise TransferError(f"the sync target {target_dir} exists and is not a directory")
        created = _host_step(
            f"Creating the folders above {target_dir}",
            target_dir,
            lambda: make_dirs(target_dir.parent),
        )
        own = workdir is None
        installed = False
        try:
            if workdir is None:
                workdir = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=target_dir.parent))
            staged = workdir / "tree"
            _host_step(
                f"Extracting into {target_dir}",
                target_dir,
                lambda: _stage(checked, staged, target_dir),
            )
            install_tree(staged, target_dir, workdir / "replaced", mode=mode)
            installed = True
            if mode is not None:
                for directory in created:
                    directory.chmod(mode)
        finally:
            if own and workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            if not installed:
                remove_new_dirs(created)  # leave no empty parents behind
        return checked.regular


class _StageFailed(Exception):
    def __init__(self, relative: str, cause: OSError) -> None:
        super().__init__(relative)
        self.relative = relative
        self.cause = cause


def _host_step(step: str, target: Path, action: Callable[[], _T]) -> _T:
    """Run ``action``; an OSError becomes a TransferError naming ``step`` ("Extracting into
    <target>"), the path it failed on and the cause."""
    try:
        return action()
    except _StageFailed as failed:
        raise _error(step, failed.cause, target / failed.relative) from failed.cause
    except OSError as exc:
        raise _error(step, exc, Path(exc.filename or target)) from exc


def _error(step: str, cause: OSError, where: Path) -> TransferError:
    reason = cause.strerror or type(cause).__name__
    return TransferError(f"{step} failed on the host: {reason} ({where}){_KEPT}")


def _relative(name: str) -> str:
    """The member's path below the root ("" for the root); the checked names are canonical,
    and anything else is refused here too rather than trusted."""
    if name == ".":
        return ""
    if name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/")):
        raise TransferError(f"refusing to extract a member named {name!r}")
    return name


def _stage(checked: ValidatedArchive, root: Path, target: Path) -> None:
    """Create every checked member below ``root`` (a new folder); see the module docstring."""
    root.mkdir(mode=0o700)
    directories: list[tuple[Path, float]] = []
    made: set[str] = {""}
    for member in checked.members:
        relative = _relative(member.name)
        path = root / relative if relative else root
        times = (member.mtime, member.mtime)
        try:
            parent = relative.rpartition("/")[0]
            if parent not in made:
                (root / parent).mkdir(parents=True, exist_ok=True)
                made.add(parent)
            if member.isdir():
                if relative not in made:
                    path.mkdir()
                    made.add(relative)
                directories.append((path, member.mtime))
            elif member.issym():
                path.symlink_to(member.linkname)
                os.utime(path, times, follow_symlinks=False)
            elif member.islnk():
                path.hardlink_to(root / member.linkname)
                path.chmod(file_mode(member.mode))
                os.utime(path, times)
            elif member.isreg():
                _write_file(checked, member, path)
            else:  # the validator refuses every other type; never create one
                raise TransferError(f"refusing to extract {member.name!r}: not a plain member")
        except OSError as exc:
            raise _StageFailed(relative, exc) from exc
    for directory, mtime in reversed(directories):
        os.utime(directory, (mtime, mtime))


def _write_file(checked: ValidatedArchive, member: tarfile.TarInfo, path: Path) -> None:
    source = checked.tar.extractfile(member)
    if source is None:
        raise TransferError(f"could not read {member.name!r} from the archive")
    fd = os.open(path, _CREATE, 0o600)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(source, out, COPY_BUFFER)
        out.flush()
        os.fchmod(fd, file_mode(member.mode))
        os.utime(fd, (member.mtime, member.mtime))
