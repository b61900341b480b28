"""sync_files._write_all: every chunk, in order, however little each writev takes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from provider.driver import sync_files


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
