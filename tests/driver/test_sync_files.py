"""sync_files: ``_write_all`` writes every chunk in order however little each writev takes;
``make_dirs`` creates private folders and refuses a link raced into the path."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from provider.driver.transfer import sync_files


def test_chunks_are_written_in_order_without_a_joined_copy(tmp_path: Path) -> None:
    chunks = [b"alpha", b"", b"beta" * 1000, b"\x00" * 70_000, b"end"]
    path = tmp_path / "data"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        sync_files._write_all(fd, chunks)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(chunks)


def test_partial_writes_resume_mid_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.writev
    calls: list[int] = []

    def stingy(fd: int, buffers: list[memoryview]) -> int:  # at most 7 bytes, across buffers
        calls.append(len(buffers))
        taken: list[bytes] = []
        left = 7
        for buffer in buffers:
            piece = bytes(buffer[:left])
            taken.append(piece)
            left -= len(piece)
            if not left:
                break
        return real(fd, taken)

    monkeypatch.setattr(os, "writev", stingy)
    monkeypatch.setattr(sync_files, "IOV_MAX", 2)  # also cut the buffer list
    chunks = [b"0123456789", b"ab", b"c", b"defghijklmnopqrstuvwxyz"]
    path = tmp_path / "data"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        sync_files._write_all(fd, chunks)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(chunks)
    assert len(calls) == 6 and max(calls) <= 2  # 36 bytes at 7 per call


def test_make_dirs_creates_private_folders_and_answers_only_its_own(tmp_path: Path) -> None:
    (tmp_path / "have").mkdir(mode=0o755)
    target = tmp_path / "have" / "a" / "b"
    assert sync_files.make_dirs(target) == [tmp_path / "have" / "a", target]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in (target, target.parent))
    assert sync_files.make_dirs(target) == []
    # "c/.." exists once "c" is made: used, not claimed (it is "have", not ours to chmod).
    assert sync_files.make_dirs(tmp_path / "have" / "c" / "..") == [tmp_path / "have" / "c"]


@pytest.mark.parametrize("intruder", ["link", "file"])
def test_make_dirs_refuses_a_component_that_appears_as_a_link_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, intruder: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    raced = tmp_path / "raced"
    real_mkdir = Path.mkdir

    def racing_mkdir(self: Path, mode: int = 0o777, *args: Any, **kwargs: Any) -> None:
        if self == raced:  # another process wins the race with a link (or a file)
            if intruder == "link":
                raced.symlink_to(outside)
            else:
                raced.write_text("x")
        real_mkdir(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", racing_mkdir)
    with pytest.raises(FileExistsError):
        sync_files.make_dirs(raced / "inner")
    assert list(outside.iterdir()) == []
