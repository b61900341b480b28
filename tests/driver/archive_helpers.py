"""Helpers for the archive tests: hand-made tar members, a sample tree, exact tree snapshots."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
from pathlib import Path

Member = tuple[tarfile.TarInfo, bytes | None]
Snapshot = dict[str, tuple[object, ...]]


def entry(
    name: str,
    kind: bytes = tarfile.REGTYPE,
    *,
    data: bytes = b"",
    linkname: str = "",
    mode: int = 0o644,
) -> Member:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = linkname
    if kind in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
        info.size = len(data)
        return info, data
    return info, None


def write_tar(path: Path, items: list[Member], fmt: int = tarfile.PAX_FORMAT) -> Path:
    with tarfile.open(path, "w", format=fmt) as tf:
        for info, data in items:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


# Archives the validation refuses whole (docs/protocol.md 5.7), after a harmless first member.
HOSTILE = {
    "absolute": [entry("/etc/evil", data=b"x")],
    "dot-dot": [entry("a/../../evil", data=b"x")],
    "write through an escaping link": [
        entry("up", tarfile.SYMTYPE, linkname="../outside"),
        entry("up/x", data=b"x"),
    ],
    "write through a link": [
        entry("l", tarfile.SYMTYPE, linkname="d"),
        entry("d", tarfile.DIRTYPE),
        entry("l/x", data=b"x"),
    ],
    "hard link outside": [entry("h", tarfile.LNKTYPE, linkname="../outside")],
    "device": [entry("dev", tarfile.CHRTYPE)],
    "fifo": [entry("fifo", tarfile.FIFOTYPE)],
}

SAMPLE_MODES = {
    "bin/run": 0o755,
    "bin/setuid": 0o4755,
    "private": 0o600,
    "shared-write": 0o666,
    "no-access": 0o000,
    "group-exec-only": 0o654,
}


def sample_archive(tmp_path: Path) -> Path:
    """GNU tar of a tree with every kind the sync carries: bytes, odd modes (setuid too), a
    symlink and a hard link inside the tree, empty and nested directories, old mtimes."""
    src = tmp_path / "sample-src"
    (src / "bin").mkdir(parents=True)
    (src / "deep" / "er" / "est").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "closed").mkdir(mode=0o700)
    (src / "data.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    (src / "deep" / "er" / "est" / "leaf").write_bytes(bytes(range(256)))
    for name, mode in SAMPLE_MODES.items():
        (src / name).write_text(name)
        (src / name).chmod(mode)
    (src / "link").symlink_to("deep/er/est/leaf")
    (src / "dirlink").symlink_to("deep/er")
    (src / "hard").hardlink_to(src / "data.bin")
    for index, path in enumerate(sorted(src.rglob("*"))):
        os.utime(path, (1_600_000_000 + index, 1_600_000_000 + index), follow_symlinks=False)
    archive = tmp_path / "sample.tar"
    subprocess.run(["tar", "-cf", str(archive), "-C", str(src), "."], check=True)
    return archive


def snapshot(root: Path, *, inodes: bool = True) -> Snapshot:
    """Every entry below ``root`` (not followed): kind, mode, bytes or link text, mtime (not of
    symlinks) and, with ``inodes``, the inode number, so a replaced file shows."""
    found: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            data: object = None
            if stat.S_ISLNK(st.st_mode):
                data = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                data = path.read_bytes()
            mtime = None if stat.S_ISLNK(st.st_mode) else st.st_mtime_ns
            key = str(path.relative_to(root))
            found[key] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), data, mtime)
            if inodes:
                found[key] += (st.st_ino,)
    return found
