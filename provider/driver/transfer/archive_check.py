"""Host-side validation of an archive downloaded from the sandbox (docs/protocol.md 5.7), whole
archive first.

Rules, any failure refusing the whole archive with one generic message:

- strict parse: a tarfile error, a header that is not a valid header, a member whose data runs
  past the end of the file, or anything but zero bytes (at least two blocks) after the last member;
- declared sizes (all members) sum to at most ``max_total``; non-regular members declare size 0;
  one extended header read is at most 16 MiB; at most ``max_members`` members;
- names (``./`` prefixes and ``.``/empty segments dropped): not absolute, no ``..`` segment, no
  backslash, no NUL; the root itself only as a directory; no duplicates except directories;
  the checked members carry these canonical names, so extraction writes exactly what was checked;
- types: regular (old style included), directory, symlink, hard link; devices, FIFOs,
  contiguous, sparse (GNU or PAX) and anything else refused;
- no member lies below a member that is not a directory (nothing is written through a link);
- symlink targets: non-empty, no backslash or NUL, otherwise kept as text, absolute or leaving
  the root included (a virtualenv's ``bin/python -> /usr/bin/python3``): a symlink is only a
  name, nothing is ever created below one (the rule above) and neither extraction nor install
  follows one, so its target is never read or written here (RELIABILITY.md "Sync out on the
  host" has the whole argument); a hard link names an earlier regular member, from the root and
  without ``..`` (stricter than "stays inside": GNU tar never writes anything else).

The error names the first refused entry (``ArchiveRefused.entry``) when there is one.

Extraction (:mod:`provider.driver.transfer.archive_extract`) then creates the checked members
itself, with the ``data`` filter's mode rules, never through a link, and guards against links that
already exist in the target directory.
"""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from provider.errors import TransferError

MAX_MEMBERS = 1_000_000
_MAX_SINGLE_READ = 16 * 1024 * 1024
_ALLOWED = {tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE}
_REGULAR = {tarfile.REGTYPE, tarfile.AREGTYPE}

_Key = tuple[str, ...]


COPY_BUFFER = 1024 * 1024
"""Bytes per read/write when extracting a member (tarfile's default, 16 KiB, costs CPU)."""


class ArchiveRefused(TransferError):
    """The sandbox's archive failed validation; nothing was extracted."""

    def __init__(self, reason: str, entry: str | None = None) -> None:
        named = f" (refused entry: {entry[:200]!r})" if entry is not None else ""
        super().__init__(
            "the archive from the sandbox was refused: it is malformed or holds an unsafe entry "
            "(absolute or '..' path, device, FIFO, sparse file, bad link, or too much data); "
            f"nothing was extracted{named}"
        )
        self.reason = reason  # for tests and debugging; not part of the public message
        self.entry = entry


class _Oversized(Exception):
    pass


class _CappedReader(io.RawIOBase):
    """A file reader that refuses one huge read (tarfile reads extended headers whole)."""

    def __init__(self, raw: io.BufferedReader) -> None:
        super().__init__()
        self._raw = raw

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size > _MAX_SINGLE_READ:
            raise _Oversized
        return self._raw.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def close(self) -> None:
        self._raw.close()
        super().close()


def _segments(name: str) -> _Key | None:
    """Normalized path segments of a member name or link target, None if it uses ``..``."""
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        return None
    return tuple(parts)


def _check_text(text: str, what: str) -> None:
    if "\0" in text or "\\" in text:
        raise ArchiveRefused(f"{what} holds NUL or a backslash")
    if text.startswith("/"):
        raise ArchiveRefused(f"{what} is absolute")


def _check_member(member: tarfile.TarInfo, kinds: dict[_Key, str]) -> None:
    if member.type not in _ALLOWED:
        raise ArchiveRefused(f"member type {member.type!r} is not allowed")
    if member.sparse is not None or any(k.startswith("GNU.sparse") for k in member.pax_headers):
        raise ArchiveRefused("sparse member")
    if member.size < 0 or (member.type not in _REGULAR and member.size != 0):
        raise ArchiveRefused("a member declares an impossible size")
    _check_text(member.name, "a member name")
    key = _segments(member.name)
    if key is None:
        raise ArchiveRefused("a member name has a '..' segment")
    kind = {tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "link", tarfile.LNKTYPE: "hard"}.get(
        member.type, "file"
    )
    if not key and kind != "dir":
        raise ArchiveRefused("the archive root is not a directory")
    previous = kinds.get(key)
    if previous is not None and not (previous == kind == "dir"):
        raise ArchiveRefused("a member name appears twice")
    if kind in ("link", "hard"):
        if not member.linkname:
            raise ArchiveRefused("a link has an empty target")
        if "\0" in member.linkname or "\\" in member.linkname:
            raise ArchiveRefused("a link target holds NUL or a backslash")
    if kind == "hard":
        _check_text(member.linkname, "a hard link target")
        target = _segments(member.linkname)
        if target is None or kinds.get(target) != "file":
            raise ArchiveRefused("a hard link does not name an earlier regular member")
        member.linkname = "/".join(target)
    kinds[key] = kind
    # Extraction uses these checked, canonical names (never "a/./b", "a//b" or "x/.").
    member.name = "/".join(key) if key else "."


def _check_tree(kinds: dict[_Key, str]) -> None:
    for key in kinds:
        for end in range(1, len(key)):
            if kinds.get(key[:end], "dir") != "dir":
                raise ArchiveRefused("a member lies below a link or a file", "/".join(key))


def _check_trailer(raw: io.BufferedReader, end: int, file_size: int) -> None:
    if file_size - end < 2 * tarfile.BLOCKSIZE:
        raise ArchiveRefused("the end-of-archive marker is missing")
    raw.seek(end)
    while chunk := raw.read(1024 * 1024):
        if chunk.count(0) != len(chunk):
            raise ArchiveRefused("data after the end of the archive is not a valid member")


@dataclass
class ValidatedArchive:
    """An archive that passed validation, still open for extraction (close it, or use ``with``)."""

    tar: tarfile.TarFile
    members: list[tarfile.TarInfo]
    regular: int  # regular-file members
    raw: io.BufferedReader

    def close(self) -> None:
        self.tar.close()
        self.raw.close()

    def __enter__(self) -> ValidatedArchive:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_validated(
    archive: Path, *, max_total: int = 10 * 1024**3, max_members: int = MAX_MEMBERS
) -> ValidatedArchive:
    """Validate the whole of ``archive`` and return it open for extraction.

    Raises ArchiveRefused, or TransferError when the file cannot be read.
    """
    try:
        raw = open(archive, "rb")  # noqa: SIM115 - owned by the returned ValidatedArchive
    except OSError as exc:
        raise TransferError(f"could not read the downloaded archive: {exc.strerror}") from exc
    tar: tarfile.TarFile | None = None
    try:
        file_size = os.fstat(raw.fileno()).st_size
        # What tarfile.open(mode="r:") builds (plain tar), with a larger copy buffer.
        tar = tarfile.TarFile(fileobj=_CappedReader(raw), mode="r", copybufsize=COPY_BUFFER)
        kinds: dict[_Key, str] = {}
        members: list[tarfile.TarInfo] = []
        total = regular = 0
        for member in tar:
            members.append(member)
            if len(members) > max_members:
                raise ArchiveRefused("too many members")
            try:
                _check_member(member, kinds)
            except ArchiveRefused as refused:
                raise ArchiveRefused(refused.reason, member.name) from None
            total += member.size
            if total > max_total:
                raise ArchiveRefused("declared sizes exceed the limit")
            if member.offset_data + member.size > file_size:
                raise ArchiveRefused("a member's data runs past the end of the file")
            regular += member.type in _REGULAR
        _check_tree(kinds)
        _check_trailer(raw, tar.offset, file_size)
        return ValidatedArchive(tar, members, regular, raw)
    except BaseException as exc:
        if tar is not None:
            tar.close()
        raw.close()
        if isinstance(exc, ArchiveRefused | TransferError):
            raise
        if isinstance(exc, _Oversized):
            raise ArchiveRefused("an extended header is too large") from None
        if isinstance(exc, tarfile.TarError | EOFError | ValueError | OverflowError):
            raise ArchiveRefused(f"not a valid tar archive ({type(exc).__name__})") from exc
        if isinstance(exc, OSError):
            raise TransferError(f"could not read the downloaded archive: {exc.strerror}") from exc
        raise
