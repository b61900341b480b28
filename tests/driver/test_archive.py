"""Building directory archives: exclusion globs, links kept or followed, streaming round trips."""

from __future__ import annotations

import os
import stat
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from provider.driver.transfer.archive import (
    ArchiveStats,
    LinkEscapes,
    build_directory_archive,
    check_follow_symlinks,
    extract_archive,
    is_excluded,
)
from provider.errors import RequestRefused, TransferError


def members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive) as tf:
        return {m.name: m for m in tf.getmembers()}


def content(archive: Path, name: str) -> bytes:
    with tarfile.open(archive) as tf:
        handle = tf.extractfile(name)
        assert handle is not None
        return handle.read()


def in_thread(work: Callable[[], object], timeout: float = 60.0) -> object:
    """Run ``work`` in a thread; a blocking open (of a FIFO) would leave it unfinished."""
    box: list[object] = []
    thread = threading.Thread(target=lambda: box.append(work()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "archiving blocked: it opened something it must not open"
    return box[0]


# --- exclusion globs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "pattern", "excluded"),
    [
        ("node_modules", "node_modules", True),
        ("node_modules/x/y.js", "node_modules", True),
        ("a/b/node_modules", "node_modules", True),
        ("a/b/node_modules/c", "node_modules", True),
        ("a/node_modules_old", "node_modules", False),
        ("my_node_modules", "node_modules", False),
        ("./node_modules/", "node_modules/", True),
        ("x.log", "*.log", True),
        ("deep/er/x.log", "*.log", True),
        ("x.log.txt", "*.log", False),
        ("src/a.js", "src/*.js", True),
        ("src/lib/a.js", "src/*.js", False),
        ("pkg/src/a.js", "src/*.js", True),
        ("src/lib/a.js", "src/**/*.js", True),
        ("src/a.js", "src/**/*.js", True),
        ("src/lib/deep/a.js", "src/**/*.js", True),
        ("other/lib/a.js", "src/**/*.js", False),
        ("a/b/c", "a/**", True),
        ("a", "a/**", False),
        ("anything/at/all", "**", True),
        ("build", "**/build", True),
        ("x/build/y", "**/build", True),
        ("a.txt", "?.txt", True),
        ("ab.txt", "?.txt", False),
        ("a/b", "a?b", False),
        ("file1", "file[0-9]", True),
        ("filex", "file[0-9]", False),
        ("filex", "file[!0-9]", True),
        ("file/", "file[!0-9]", False),
        ("a*b", "a\\*b", True),
        ("axb", "a\\*b", False),
        ("[x", "[x", True),
        ("a.b", "a.b", True),
        ("axb", "a.b", False),
        (".env", "*", True),
        ("x", "", False),
        ("x", "/x", False),
        ("a/b", "a**b", False),
        ("ab", "a**b", True),
    ],
)
def test_exclusion_glob_semantics(name: str, pattern: str, excluded: bool) -> None:
    assert is_excluded(name, [pattern]) is excluded


def test_exclusion_with_several_patterns() -> None:
    patterns = ["*.tmp", "dist"]
    assert is_excluded("a/b.tmp", patterns)
    assert is_excluded("dist/x", patterns)
    assert not is_excluded("src/x", patterns)
    assert not is_excluded("src/x", [])
    assert not is_excluded("./", patterns)


# --- building without followSymlinks ------------------------------------------------------------


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sub" / "node_modules" / "pkg").mkdir(parents=True)
    (src / "node_modules").mkdir()
    (src / "node_modules" / "top.js").write_text("x")
    (src / "sub" / "node_modules" / "pkg" / "i.js").write_text("y")
    (src / "keep").write_bytes(bytes(range(256)))
    (src / "keep").chmod(0o600)
    (src / "link").symlink_to("keep")
    (src / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (src / "sub" / "run.sh").chmod(0o755)
    (src / "sub" / "debug.log").write_text("log")
    (src / "sub" / "lib").mkdir()
    (src / "sub" / "lib" / "a.js").write_text("a")
    (src / "ünï cødé 'q'").write_text("u")
    (src / ("long-" + "n" * 150)).write_text("long")
    return src


def test_archive_members_are_rooted_and_normalized(source: Path, tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    stats = build_directory_archive(source, archive, exclude=[], follow_symlinks=False)
    found = members(archive)
    assert all(name.startswith("./") for name in found)
    assert "." not in found and "./" not in found
    for info in found.values():
        assert (info.uid, info.gid, info.uname, info.gname) == (0, 0, "", "")
    assert found["./keep"].mode == 0o600
    assert found["./sub/run.sh"].mode == 0o755
    assert found["./keep"].mtime == int((source / "keep").stat().st_mtime)
    assert found["./link"].issym() and found["./link"].linkname == "keep"
    assert found["./sub"].isdir()
    regular = [m for m in found.values() if m.isreg()]
    assert stats == ArchiveStats(files=len(regular), bytes=archive.stat().st_size, skipped=0)
    assert content(archive, "./keep") == bytes(range(256))
    # PAX: a non-ASCII name and a long name travel in extended headers, nothing is cut.
    assert found["./ünï cødé 'q'"].pax_headers["path"] == "./ünï cødé 'q'"
    assert "./long-" + "n" * 150 in found


def test_round_trip_with_exclusions(source: Path, tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    build_directory_archive(
        source, archive, exclude=["node_modules", "*.log", "sub/lib/**"], follow_symlinks=False
    )
    out = tmp_path / "out"
    count = extract_archive(archive, out, mode=None)
    names = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert names == sorted(
        ["keep", "link", "sub", "sub/run.sh", "sub/lib", "ünï cødé 'q'", "long-" + "n" * 150]
    )
    assert count == 4
    assert (out / "keep").read_bytes() == bytes(range(256))
    assert stat.S_IMODE((out / "keep").stat().st_mode) == 0o600
    assert os.readlink(out / "link") == "keep"
    assert stat.S_IMODE((out / "sub" / "run.sh").stat().st_mode) == 0o755


def test_excluded_directory_subtree_is_never_read(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "node_modules").mkdir(parents=True)
    os.mkfifo(src / "node_modules" / "fifo")
    (src / "node_modules" / "escape").symlink_to("/etc")
    (src / "ok").write_text("ok")
    archive = tmp_path / "a.tar"
    stats = in_thread(
        lambda: build_directory_archive(
            src, archive, exclude=["node_modules"], follow_symlinks=True
        )
    )
    assert isinstance(stats, ArchiveStats)
    assert stats.skipped == 0
    assert set(members(archive)) == {"./ok"}
    check_follow_symlinks(src, exclude=["node_modules"])
    with pytest.raises(LinkEscapes):
        check_follow_symlinks(src)


def test_links_are_archived_as_links_and_targets_never_opened(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    os.mkfifo(tmp_path / "outside-fifo")
    (src / "to-fifo").symlink_to(tmp_path / "outside-fifo")
    (src / "to-etc").symlink_to("/etc/shadow")
    (src / "dangling").symlink_to("nowhere/at/all")
    (src / "up").symlink_to("..")
    os.mkfifo(src / "inner-fifo")
    archive = tmp_path / "a.tar"
    stats = in_thread(
        lambda: build_directory_archive(src, archive, exclude=[], follow_symlinks=False)
    )
    assert isinstance(stats, ArchiveStats)
    assert stats.files == 0
    assert stats.skipped == 1  # the FIFO itself is left out, not opened
    found = members(archive)
    assert {name: m.linkname for name, m in found.items()} == {
        "./to-fifo": str(tmp_path / "outside-fifo"),
        "./to-etc": "/etc/shadow",
        "./dangling": "nowhere/at/all",
        "./up": "..",
    }
    assert all(m.issym() and m.size == 0 for m in found.values())


def test_archive_inside_its_own_source_is_not_archived(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_text("a")
    archive = src / "zz-data.tar"
    stats = build_directory_archive(src, archive, exclude=[], follow_symlinks=False)
    assert set(members(archive)) == {"./a"}
    assert stats.files == 1


def test_empty_directory_gives_a_valid_empty_archive(tmp_path: Path) -> None:
    src = tmp_path / "empty"
    src.mkdir()
    archive = tmp_path / "a.tar"
    stats = build_directory_archive(src, archive, exclude=[], follow_symlinks=False)
    assert stats.files == 0
    assert members(archive) == {}
    assert extract_archive(archive, tmp_path / "out", mode=0o755) == 0
    assert (tmp_path / "out").is_dir()


def test_missing_source_is_a_transfer_error(tmp_path: Path) -> None:
    with pytest.raises(TransferError):
        build_directory_archive(
            tmp_path / "missing", tmp_path / "a.tar", exclude=[], follow_symlinks=False
        )
    (tmp_path / "file").write_text("x")
    with pytest.raises(TransferError):
        build_directory_archive(
            tmp_path / "file", tmp_path / "b.tar", exclude=[], follow_symlinks=False
        )


# --- followSymlinks ------------------------------------------------------------------------------


@pytest.fixture
def follow_tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "data" / "nested").mkdir(parents=True)
    (src / "data" / "nested" / "n.txt").write_text("nested")
    (src / "target.bin").write_bytes(b"\x00target\xff")
    (src / "target.bin").chmod(0o640)
    (src / "file-link").symlink_to("target.bin")
    (src / "dir-link").symlink_to("data")
    (src / "data" / "back").symlink_to("../target.bin")
    (src / "abs-inside").symlink_to(src / "target.bin")
    (src / "chain").symlink_to("file-link")
    return src


def test_follow_dereferences_links_that_stay_inside(follow_tree: Path, tmp_path: Path) -> None:
    check_follow_symlinks(follow_tree)
    archive = tmp_path / "a.tar"
    stats = build_directory_archive(follow_tree, archive, exclude=[], follow_symlinks=True)
    found = members(archive)
    assert not any(m.issym() or m.islnk() for m in found.values())
    for name in ("./file-link", "./abs-inside", "./chain", "./data/back", "./dir-link/back"):
        assert found[name].isreg(), name
        assert content(archive, name) == b"\x00target\xff"
        assert found[name].mode == 0o640
    assert found["./dir-link"].isdir()
    assert content(archive, "./dir-link/nested/n.txt") == b"nested"
    assert stats.files == sum(1 for m in found.values() if m.isreg()) == 8


def test_follow_through_a_linked_source_root(follow_tree: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(follow_tree)
    check_follow_symlinks(alias)
    archive = tmp_path / "a.tar"
    build_directory_archive(alias, archive, exclude=[], follow_symlinks=True)
    assert content(archive, "./abs-inside") == b"\x00target\xff"


def escape_cases(tmp_path: Path) -> dict[str, Callable[[Path], None]]:
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "secret").write_text("secret")

    def file_outside(src: Path) -> None:
        (src / "leak").symlink_to(outside / "secret")

    def relative_outside(src: Path) -> None:
        (src / "sub").mkdir()
        (src / "sub" / "leak").symlink_to("../../outside/secret")

    def dir_outside(src: Path) -> None:
        (src / "leakdir").symlink_to("../outside")

    def dangling(src: Path) -> None:
        (src / "gone").symlink_to("does-not-exist")

    def ancestor(src: Path) -> None:
        (src / "a" / "b").mkdir(parents=True)
        (src / "a" / "b" / "up").symlink_to("../..")

    def self_loop(src: Path) -> None:
        (src / "me").symlink_to("me")

    def mutual_dirs(src: Path) -> None:
        (src / "x").mkdir()
        (src / "y").mkdir()
        (src / "x" / "to-y").symlink_to("../y")
        (src / "y" / "to-x").symlink_to("../x")

    def sibling_prefix(src: Path) -> None:
        sibling = src.parent / (src.name + "-other")
        sibling.mkdir()
        (sibling / "f").write_text("f")
        (src / "prefix").symlink_to(sibling / "f")

    return {
        "file_outside": file_outside,
        "relative_outside": relative_outside,
        "dir_outside": dir_outside,
        "dangling": dangling,
        "ancestor": ancestor,
        "self_loop": self_loop,
        "mutual_dirs": mutual_dirs,
        "sibling_prefix": sibling_prefix,
    }


@pytest.mark.parametrize(
    "case",
    [
        "file_outside",
        "relative_outside",
        "dir_outside",
        "dangling",
        "ancestor",
        "self_loop",
        "mutual_dirs",
        "sibling_prefix",
    ],
)
def test_escaping_links_are_refused(tmp_path: Path, case: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "fine").write_text("fine")
    escape_cases(tmp_path)[case](src)
    with pytest.raises(LinkEscapes) as info:
        check_follow_symlinks(src)
    assert isinstance(info.value, RequestRefused)
    assert "leaves the source directory" in str(info.value)
    archive = tmp_path / "a.tar"
    with pytest.raises(LinkEscapes):
        build_directory_archive(src, archive, exclude=[], follow_symlinks=True)
    # Without followSymlinks the same tree archives fine, links kept as links.
    build_directory_archive(src, tmp_path / "plain.tar", exclude=[], follow_symlinks=False)
    assert any(m.issym() for m in members(tmp_path / "plain.tar").values())


def test_links_are_rechecked_while_archiving(follow_tree: Path, tmp_path: Path) -> None:
    check_follow_symlinks(follow_tree)
    (tmp_path / "outside.txt").write_text("secret")
    (follow_tree / "file-link").unlink()
    (follow_tree / "file-link").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(LinkEscapes, match="leaves the source"):
        build_directory_archive(follow_tree, tmp_path / "a.tar", exclude=[], follow_symlinks=True)


def test_follow_skips_links_to_fifos_without_opening_them(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    os.mkfifo(src / "fifo")
    (src / "to-fifo").symlink_to("fifo")
    archive = tmp_path / "a.tar"
    stats = in_thread(
        lambda: build_directory_archive(src, archive, exclude=[], follow_symlinks=True)
    )
    assert isinstance(stats, ArchiveStats)
    assert stats.skipped == 2
    assert members(archive) == {}


def test_large_file_is_streamed_exactly(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    block = os.urandom(1 << 20)
    with (src / "big").open("wb") as handle:
        for _ in range(24):
            handle.write(block)
    archive = tmp_path / "a.tar"
    build_directory_archive(src, archive, exclude=[], follow_symlinks=False)
    out = tmp_path / "out"
    assert extract_archive(archive, out, mode=None) == 1
    assert (out / "big").stat().st_size == 24 << 20
    with (out / "big").open("rb") as handle:
        for _ in range(24):
            assert handle.read(1 << 20) == block
