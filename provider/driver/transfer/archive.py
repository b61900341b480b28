"""Directory archives for file sync: exclusion globs, building, validation and extraction.

All functions block (disk and tar work); callers run them in worker threads. Archives are
uncompressed PAX tars built with :mod:`tarfile`, members rooted at ``./`` (``./keep``,
``./sub/file``; no entry for the root itself), uid/gid 0 without user or group names, integer
mtimes kept, permission bits kept without setuid/setgid/sticky. A host hard link is stored as a
regular file each time it appears. Sockets, FIFOs and device files are skipped, never opened,
and counted (with the first few names) so the caller can report them.

Exclusion patterns (inbound, host side; docs/protocol.md 5.8)
--------------------------------------------------
Each archive-relative name (``./`` and trailing ``/`` stripped, e.g. ``src/app/main.py``) is
excluded when some pattern ``p`` (with ``./`` and trailing ``/`` stripped likewise) matches the
whole name as ``p``, ``p/**``, ``**/p`` or ``**/p/**``. So a bare name such as ``node_modules``
excludes that name at any depth together with everything below it, and ``src/gen`` excludes that
path relative to any directory. Inside a pattern:

- ``*`` matches any run of characters except ``/`` (``*.log`` matches ``a.log`` and, through the
  ``**/p`` form, ``dir/a.log``; ``src/*.js`` does not match ``src/lib/x.js``);
- ``**`` as a whole path segment matches zero or more directories (``a/**/b`` matches ``a/b``
  and ``a/x/y/b``); ``**`` inside a segment counts as ``*``;
- ``?`` matches one character except ``/``; ``[abc]``, ``[a-z]``, ``[!abc]`` / ``[^abc]`` match
  one character (never ``/``) from or not from the set; ``\\`` makes the next character literal;
- everything else, including a leading ``.`` of a file name, matches itself literally;
  an empty pattern matches nothing, and a pattern starting with ``/`` matches nothing.

An excluded directory is not descended into. With ``followSymlinks`` the same names are used,
so a link under an excluded directory is neither followed nor checked. Outbound exclusions are
GNU ``tar --exclude`` patterns evaluated in the sandbox, which match any name component; the two
matchers differ slightly (accepted by docs/protocol.md 5.8).
"""

from __future__ import annotations

import functools
import os
import re
import stat
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from provider.driver.transfer.archive_check import ArchiveRefused, open_validated
from provider.driver.transfer.archive_extract import extract_archive
from provider.errors import RequestRefused, TransferError

__all__ = [
    "ArchiveRefused",
    "ArchiveStats",
    "LinkEscapes",
    "build_directory_archive",
    "check_follow_symlinks",
    "extract_archive",
    "is_excluded",
    "validate_archive",
]

MAX_ARCHIVE_TOTAL = 10 * 1024**3
SKIPPED_NAMES = 5
_COPY_BUFFER = 1024 * 1024
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkEscapes(RequestRefused):
    """With followSymlinks, a link leaves the source directory (docs/protocol.md 5.5)."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(
            f"followSymlinks: the symbolic link {name!r} leaves the source directory ({why}); "
            "the whole sync was refused"
        )
        self.name = name


@dataclass(frozen=True)
class ArchiveStats:
    files: int  # regular-file members
    bytes: int  # size of the archive file, headers included
    skipped: int = 0  # sockets, FIFOs and devices left out
    skipped_names: tuple[str, ...] = ()  # the first SKIPPED_NAMES of them, archive-relative


# --- exclusions --------------------------------------------------------------------------------


def _strip_name(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def _translate_segment(segment: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "*":
            while i + 1 < len(segment) and segment[i + 1] == "*":
                i += 1
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "\\" and i + 1 < len(segment):
            i += 1
            out.append(re.escape(segment[i]))
        elif char == "[" and (close := _class_end(segment, i)) > 0:
            body = segment[i + 1 : close]
            negate = body[:1] in ("!", "^")
            if negate:
                body = body[1:]
            escaped = "".join("\\" + c if c in "\\^[]" else c for c in body)
            out.append(f"[^/{escaped}]" if negate else f"(?!/)[{escaped}]")
            i = close
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def _class_end(segment: str, start: int) -> int:
    """Index of the ``]`` closing the class opened at ``start``, or -1."""
    i = start + 1
    if i < len(segment) and segment[i] in "!^":
        i += 1
    if i < len(segment) and segment[i] == "]":
        i += 1
    close = segment.find("]", i)
    return close


@functools.lru_cache(maxsize=512)
def _pattern_regex(pattern: str) -> re.Pattern[str] | None:
    body_source = _strip_name(pattern)
    if not body_source:
        return None
    segments = body_source.split("/")
    parts: list[str] = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            parts.append(".*" if last else "(?:[^/]*/)*")
        else:
            parts.append(_translate_segment(segment) + ("" if last else "/"))
    return re.compile(r"(?:.*/)?" + "".join(parts) + r"(?:/.*)?\Z", re.DOTALL)


def is_excluded(relative_name: str, patterns: Sequence[str]) -> bool:
    """True when ``relative_name`` matches one of ``patterns`` (semantics in the module doc)."""
    name = _strip_name(relative_name)
    if not name:
        return False
    for pattern in patterns:
        regex = _pattern_regex(pattern)
        if regex is not None and regex.match(name):
            return True
    return False


# --- the source walk ---------------------------------------------------------------------------

_Kind = Literal["dir", "file", "link", "special"]


@dataclass(frozen=True)
class _Entry:
    name: str  # archive-relative, without "./"
    kind: _Kind
    path: str  # host path to open: the real path for a followed link
    st: os.stat_result  # lstat of the entry, or stat of a followed link's target
    linkname: str = ""


@dataclass
class _Frame:
    real: str
    rel: str
    names: Iterator[str]
    key: tuple[int, int]


def _key(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _list_dir(path: str, expected: os.stat_result) -> Iterator[str]:
    fd = os.open(path, _OPEN_DIR)
    try:
        if _key(os.fstat(fd)) != _key(expected):
            raise TransferError(f"{path} changed while it was being archived")
        names = sorted(os.listdir(fd))  # noqa: PTH208 - listing the verified descriptor
    finally:
        os.close(fd)
    return iter(names)


def _follow(root: str, path: str, rel: str) -> tuple[str, os.stat_result]:
    try:
        real = os.path.realpath(path, strict=True)
    except OSError as exc:
        raise LinkEscapes(rel, "its target is missing or a link loop") from exc
    if not _inside(real, root):
        raise LinkEscapes(rel, "its target is outside the source directory")
    return real, Path(real).stat()


def _walk(source_dir: Path, exclude: Sequence[str], follow: bool) -> Iterator[_Entry]:
    root = os.path.realpath(source_dir, strict=True)
    root_st = Path(root).stat()
    if not stat.S_ISDIR(root_st.st_mode):
        raise TransferError(f"{source_dir} is not a directory")
    frames = [_Frame(root, "", _list_dir(root, root_st), _key(root_st))]
    while frames:
        frame = frames[-1]
        name = next(frame.names, None)
        if name is None:
            frames.pop()
            continue
        rel = f"{frame.rel}/{name}" if frame.rel else name
        if exclude and is_excluded(rel, exclude):
            continue
        path = f"{frame.real.rstrip('/')}/{name}"
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # vanished since the listing
        if stat.S_ISLNK(st.st_mode):
            if not follow:
                yield _Entry(rel, "link", path, st, str(Path(path).readlink()))
                continue
            path, st = _follow(root, path, rel)
            if stat.S_ISDIR(st.st_mode) and any(f.key == _key(st) for f in frames):
                raise LinkEscapes(rel, "it points at one of its own parent directories")
        if stat.S_ISDIR(st.st_mode):
            yield _Entry(rel, "dir", path, st)
            frames.append(_Frame(path, rel, _list_dir(path, st), _key(st)))
        elif stat.S_ISREG(st.st_mode):
            yield _Entry(rel, "file", path, st)
        else:
            yield _Entry(rel, "special", path, st)


def check_follow_symlinks(source_dir: Path, *, exclude: Sequence[str] = ()) -> None:
    """Spec 5.5 validation walk: raise LinkEscapes for the first link that escapes ``source_dir``
    (outside its real path, dangling, a loop, or a directory link to its own ancestor). Opens no
    file; excluded names are skipped as the archive would skip them."""
    try:
        for _ in _walk(source_dir, exclude, follow=True):
            pass
    except (LinkEscapes, TransferError):
        raise
    except OSError as exc:
        raise TransferError(f"could not scan {source_dir}: {exc.strerror or exc}") from exc


# --- building ----------------------------------------------------------------------------------


def _tarinfo(entry: _Entry, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo("./" + entry.name)
    info.mode = stat.S_IMODE(st.st_mode) & 0o777
    info.mtime = int(st.st_mtime)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif entry.kind == "link":
        info.type = tarfile.SYMTYPE
        info.linkname = entry.linkname
    else:
        info.type = tarfile.REGTYPE
        info.size = st.st_size
    return info


def _add_file(tar: tarfile.TarFile, entry: _Entry) -> None:
    fd = os.open(entry.path, _OPEN_FILE)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        st = os.fstat(fd)
        if _key(st) != _key(entry.st) or not stat.S_ISREG(st.st_mode):
            raise TransferError(f"{entry.path} changed while it was being archived")
        tar.addfile(_tarinfo(entry, st), handle)


def build_directory_archive(
    source_dir: Path, dest_file: Path, *, exclude: Sequence[str], follow_symlinks: bool
) -> ArchiveStats:
    """Write ``source_dir`` as a PAX tar to ``dest_file`` (docs/protocol.md 5.4, 5.5, 5.8).

    Without ``follow_symlinks`` entries are read with lstat and links stored as links (targets
    never opened). With it, links inside the source are dereferenced (a file link becomes a
    regular member with the target's bytes and mode, a directory link a directory walked under
    the link's name) and re-checked here; an escaping one raises LinkEscapes. File contents are
    streamed. ``dest_file`` itself is never archived even if it lies inside the source.
    """
    files = skipped = 0
    skipped_names: list[str] = []
    try:
        with tarfile.TarFile(
            dest_file, "w", format=tarfile.PAX_FORMAT, copybufsize=_COPY_BUFFER
        ) as tar:
            own_key = _key(dest_file.stat())
            for entry in _walk(source_dir, exclude, follow_symlinks):
                if entry.kind == "special":
                    skipped += 1
                    if len(skipped_names) < SKIPPED_NAMES:
                        skipped_names.append(entry.name)
                elif entry.kind == "file":
                    if _key(entry.st) == own_key:
                        continue
                    _add_file(tar, entry)
                    files += 1
                else:
                    tar.addfile(_tarinfo(entry, entry.st))
    except (LinkEscapes, TransferError):
        raise
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise TransferError(
            f"could not archive {source_dir}{where}: {exc.strerror or exc}"
        ) from exc
    return ArchiveStats(files, dest_file.stat().st_size, skipped, tuple(skipped_names))


# --- validation (extraction is provider.driver.transfer.archive_extract's)
# ------------------------------


def validate_archive(archive: Path, *, max_total: int = MAX_ARCHIVE_TOTAL) -> int:
    """Spec 5.7: check the whole archive; return its number of regular-file members.

    Raises ArchiveRefused (one generic message; the reason is in ``.reason``) for anything unsafe
    or malformed. Details of the checks are in :mod:`provider.driver.transfer.archive_check`.
    """
    with open_validated(archive, max_total=max_total) as checked:
        return checked.regular
