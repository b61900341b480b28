"""The byte-range part texts of provider.driver.transfer.sync_parts, run by real bash against a
private root (the tree of tests/driver/test_shell.py): outbound packs into parts behind the guard,
inbound parts placed in order, plus the part arithmetic and the removal argv."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from provider.driver.transfer import sync_parts
from provider.driver.transfer.sync_parts import Scratch
from tests.driver.shell_helpers import make_tree, run_bash


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path)


def parts_of(scratch: Path) -> list[Path]:
    return sorted(scratch.parent.glob(scratch.name + ".part-*"))


def joined(scratch: Path) -> bytes:
    return b"".join(part.read_bytes() for part in parts_of(scratch))


def write_parts(scratch: Path, data: bytes, part_bytes: int) -> int:
    """Lay ``data`` out as the upload would: ``<scratch>.part-NNNN`` of ``part_bytes``."""
    count = sync_parts.part_count(len(data), part_bytes)
    for index in range(count):
        chunk = data[index * part_bytes : (index + 1) * part_bytes]
        Path(sync_parts.part_path(str(scratch), index)).write_bytes(chunk)
    return count


# --- outbound: pack into parts --------------------------------------------------------------


def test_pack_file_splits_it_into_counted_parts(tree: Path, tmp_path: Path) -> None:
    data = bytes(range(256)) * 40 + b"tail"  # 10244 bytes: 3 parts of 4096
    (tree / "sub" / "f").write_bytes(data)
    scratch = tmp_path / "copy"
    result = run_bash(
        sync_parts._syncout_file_parts(str(tree / "sub" / "f"), str(scratch), 4096, str(tree))
    )
    assert result.returncode == 0, result.stderr
    assert sync_parts.parse_part_sizes(result.stdout.decode()) == [4096, 4096, 2052]
    assert [p.name[-10:] for p in parts_of(scratch)] == [".part-0000", ".part-0001", ".part-0002"]
    assert joined(scratch) == data
    assert not scratch.exists()

    (tree / "empty").write_bytes(b"")  # split writes nothing: the command adds an empty part
    scratch = tmp_path / "none"
    result = run_bash(
        sync_parts._syncout_file_parts(str(tree / "empty"), str(scratch), 4096, str(tree))
    )
    assert result.returncode == 0, result.stderr
    assert sync_parts.parse_part_sizes(result.stdout.decode()) == [0]
    assert [p.read_bytes() for p in parts_of(scratch)] == [b""]


def test_pack_file_refuses_a_directory_and_an_escaping_link(tree: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "copy"
    result = run_bash(
        sync_parts._syncout_file_parts(str(tree / "sub"), str(scratch), 4096, str(tree))
    )
    assert result.returncode == 1
    assert b"paperclip: the sandbox path is not a regular file" in result.stderr
    # abs-out is a link to a regular file outside the root: the guard refuses it.
    result = run_bash(
        sync_parts._syncout_file_parts(str(tree / "abs-out"), str(scratch), 4096, str(tree))
    )
    assert result.returncode == 1
    assert b"resolves outside" in result.stderr
    assert parts_of(scratch) == [] and not result.stdout


def test_pack_dir_tars_into_parts_with_excludes_and_h(tree: Path, tmp_path: Path) -> None:
    (tree / "sub" / "f").write_bytes(os.urandom(9000))
    (tree / "sub" / "node_modules").mkdir()
    (tree / "sub" / "node_modules" / "x").write_text("x")
    (tree / "sub" / "ln").symlink_to("f")
    for follow in (False, True):
        scratch = tmp_path / f"out-{follow}"
        script = sync_parts._syncout_dir_parts(
            str(tree / "sub"), str(scratch), 4096, ["node_modules"], follow, str(tree)
        )
        result = run_bash(script)
        assert result.returncode == 0, result.stderr
        count = sync_parts.parse_part_count(result.stdout.decode())
        assert count == len(parts_of(scratch)) > 1
        with tarfile.open(fileobj=io.BytesIO(joined(scratch))) as tf:
            members = {m.name: m for m in tf.getmembers()}
        assert "./f" in members
        assert not any("node_modules" in name for name in members)
        assert members["./ln"].issym() is (not follow)


def test_pack_dir_refuses_an_escaping_link_and_a_file(tree: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "o"
    script = sync_parts._syncout_dir_parts(
        str(tree / "link-out"), str(scratch), 4096, [], False, str(tree)
    )
    result = run_bash(script)
    assert result.returncode == 1
    assert b"resolves outside" in result.stderr
    (tree / "file").write_text("x")
    script = sync_parts._syncout_dir_parts(
        str(tree / "file"), str(scratch), 4096, [], False, str(tree)
    )
    result = run_bash(script)
    assert result.returncode == 1
    assert b"paperclip: the sandbox path is not a directory" in result.stderr
    assert parts_of(scratch) == [] and not scratch.exists()


def test_public_pack_commands_quote_everything() -> None:
    text = sync_parts.syncout_dir_parts_command(
        "/paperclip-workspace/d", "/tmp/s'x", 4096, exclude=["*.log", "a b"], follow_symlinks=True
    )
    assert (
        "tar -h --exclude='*.log' --exclude='a b' -cf - -C \"$resolved\" . "
        "| split -b 4096 -d -a 4 -- - '/tmp/s'\"'\"'x.part-' || exit 1"
    ) in text.split("\n")
    assert "'/paperclip-workspace'|'/paperclip-workspace'/*)" in text
    text = sync_parts.syncout_file_parts_command("/paperclip-workspace/f", "/tmp/s", 7)
    assert "split -b 7 -d -a 4 -- \"$resolved\" '/tmp/s.part-' || exit 1" in text.split("\n")
    for bad in (0, True):
        with pytest.raises(ValueError, match="part size"):
            sync_parts.syncout_file_parts_command("/paperclip-workspace/f", "/tmp/s", bad)


# --- inbound: place the parts ---------------------------------------------------------------


def test_placing_split_archive_extracts_the_parts_in_order(tree: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "keep").write_bytes(os.urandom(10_000))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.add(source / "keep", arcname="./keep")
    scratch = tmp_path / "scratch"
    count = write_parts(scratch, buffer.getvalue(), 4096)
    assert count > 2
    target = tree / "dest"
    result = run_bash(
        sync_parts._syncin_parts_dir(str(scratch), count, str(target), 0o750, str(tree))
    )
    assert result.returncode == 0, result.stderr
    assert (target / "keep").read_bytes() == (source / "keep").read_bytes()
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert parts_of(scratch) == []  # each part deleted once read


def test_placing_split_file_appends_the_parts_then_moves_it(tree: Path, tmp_path: Path) -> None:
    data = os.urandom(10_000)
    scratch = tmp_path / "scratch file"
    count = write_parts(scratch, data, 4096)
    target = tree / "new dir" / "it's.bin"
    result = run_bash(
        sync_parts._syncin_parts_file(str(scratch), count, str(target), 0o640, str(tree))
    )
    assert result.returncode == 0, result.stderr
    assert target.read_bytes() == data
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert parts_of(scratch) == [] and not scratch.exists()


def test_placing_parts_refuses_an_escape_and_a_missing_part(tree: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    count = write_parts(scratch, b"x" * 9000, 4096)
    escaping = str(tree / "link-out" / "f")
    for script in (
        sync_parts._syncin_parts_file(str(scratch), count, escaping, 0o644, str(tree)),
        sync_parts._syncin_parts_dir(str(scratch), count, escaping, 0o755, str(tree)),
    ):
        result = run_bash(script)
        assert result.returncode == 1
        assert b"resolves outside" in result.stderr
        assert len(parts_of(scratch)) == count  # untouched (the operation's EXIT trap removes them)
    assert sorted(os.listdir(tmp_path / "outside")) == ["secret"]

    Path(sync_parts.part_path(str(scratch), count - 1)).unlink()
    target = tree / "blob"
    result = run_bash(
        sync_parts._syncin_parts_file(str(scratch), count, str(target), 0o644, str(tree))
    )
    assert result.returncode == 1
    assert not target.exists()


# --- arithmetic, parsing, removal -----------------------------------------------------------


def test_part_texts() -> None:
    assert sync_parts.part_path("/tmp/s", 7) == "/tmp/s.part-0007"
    assert sync_parts.part_count(0, 3) == 1
    assert sync_parts.part_count(3, 3) == 1
    assert sync_parts.part_count(4, 3) == 2
    assert sync_parts.parse_part_count("noise\n__paperclip_sync_parts__ 3 5 5 1\n") == 3
    with pytest.raises(ValueError, match="printed 0 part sizes for 3 parts"):
        sync_parts.parse_part_count("__paperclip_sync_parts__ 3\n")
    with pytest.raises(ValueError):
        sync_parts.parse_part_count("")
    with pytest.raises(ValueError):
        sync_parts.parse_part_count("__paperclip_sync_parts__ 0\n")
    with pytest.raises(ValueError):
        sync_parts.part_path("/tmp/s", 10_000)
    assert Scratch("/tmp/s").removal_words() == ["'/tmp/s'"]
    assert Scratch("/tmp/s", 2).removal_words() == ["'/tmp/s'", "'/tmp/s.part-'*"]


def test_byte_ranges_and_removal_argv() -> None:
    assert sync_parts.byte_ranges(Scratch("/tmp/s"), 10, 3) == [("/tmp/s", 0, 10)]
    assert sync_parts.byte_ranges(Scratch("/tmp/s", 4), 10, 3) == [
        ("/tmp/s.part-0000", 0, 3),
        ("/tmp/s.part-0001", 3, 3),
        ("/tmp/s.part-0002", 6, 3),
        ("/tmp/s.part-0003", 9, 1),
    ]
    assert Scratch("/tmp/s").removal_command() == ("/bin/rm", ["-f", "--", "/tmp/s"])
    assert Scratch("/tmp/s", 1).removal_command() == (
        "/bin/bash",
        ["-c", 'rm -f -- "$1" "$1".part-*', "rm", "/tmp/s"],
    )


def test_removal_argv_removes_the_scratch_and_every_part(tmp_path: Path) -> None:
    scratch = tmp_path / "s x"
    scratch.write_text("s")
    write_parts(scratch, b"y" * 10, 3)
    (tmp_path / "s x.other").write_text("kept")
    command, args = Scratch(str(scratch), 1).removal_command()
    done = subprocess.run([command, *args], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path)) == ["s x.other"]
