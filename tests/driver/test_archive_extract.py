"""Our own extraction, the one path on every Python: exact trees, the ``data`` filter's rules,
hostile archives, and installs that fail leaving the target exactly as it was
(provider/driver/transfer/archive_extract.py, archive_install.py)."""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

import pytest

from provider.driver.transfer.archive import ArchiveRefused, extract_archive
from provider.driver.transfer.archive_extract import file_mode
from provider.errors import TransferError
from tests.driver.archive_helpers import (
    HOSTILE,
    SAMPLE_MODES,
    entry,
    sample_archive,
    snapshot,
    write_tar,
)


def test_a_tree_lands_exactly_as_the_data_filter_would_extract_it(tmp_path: Path) -> None:
    archive = sample_archive(tmp_path)
    ours = tmp_path / "ours"
    assert extract_archive(archive, ours, mode=None) == 2 + len(
        SAMPLE_MODES
    )  # the hard link is no regular member
    assert hasattr(tarfile, "data_filter"), "the venv Python should have the data filter"
    reference = tmp_path / "reference"
    with tarfile.open(archive) as tar:
        tar.extractall(reference, filter="data")
    assert snapshot(ours, inodes=False) == snapshot(reference, inodes=False)
    # And what that means, spelled out:
    src = tmp_path / "sample-src"
    assert (ours / "data.bin").read_bytes() == (src / "data.bin").read_bytes()
    assert (ours / "hard").stat().st_ino == (ours / "data.bin").stat().st_ino
    assert os.readlink(ours / "link") == "deep/er/est/leaf"
    assert (ours / "link").read_bytes() == bytes(range(256))
    assert os.readlink(ours / "dirlink") == "deep/er"
    assert list((ours / "empty").iterdir()) == []
    modes = {name: stat.S_IMODE((ours / name).stat().st_mode) for name in SAMPLE_MODES}
    assert modes == {
        "bin/run": 0o755,
        "bin/setuid": 0o755,  # setuid dropped
        "private": 0o600,
        "shared-write": 0o644,  # no group/other write
        "no-access": 0o600,  # owner read/write always
        "group-exec-only": 0o644,  # no execute bits unless the owner's
    }
    assert (ours / "deep" / "er" / "est" / "leaf").stat().st_mtime == (
        (src / "deep" / "er" / "est" / "leaf").stat().st_mtime
    )
    assert stat.S_IMODE(ours.stat().st_mode) == 0o700  # a new target: mapping.mode ?? 0o700


@pytest.mark.parametrize(
    ("archived", "landed"),
    [(0o7777, 0o755), (0o4700, 0o700), (0o666, 0o644), (0o070, 0o640), (0o111, 0o711)],
)
def test_file_modes_follow_the_data_filter(archived: int, landed: int) -> None:
    assert file_mode(archived) == landed
    info = tarfile.TarInfo("f")
    info.mode = archived
    filtered = tarfile.data_filter(info, "/dest")
    assert filtered.mode == landed


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archives_are_refused_before_anything_is_created(tmp_path: Path, case: str) -> None:
    archive = write_tar(tmp_path / "a.tar", [entry("ok", data=b"ok"), *HOSTILE[case]])
    target = tmp_path / "new" / "target"
    with pytest.raises(ArchiveRefused):
        extract_archive(archive, target, mode=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar"]


def test_links_already_in_the_target_are_replaced_never_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    target = tmp_path / "target"
    target.mkdir()
    (target / "hard").hardlink_to(outside)
    (target / "soft").symlink_to(outside)
    archive = write_tar(
        tmp_path / "a.tar", [entry("hard", data=b"new hard"), entry("soft", data=b"new soft")]
    )
    extract_archive(archive, target, mode=None)
    assert outside.read_bytes() == b"precious"
    assert outside.stat().st_nlink == 1
    assert (target / "hard").read_bytes() == b"new hard"
    assert not (target / "soft").is_symlink()
    assert (target / "soft").read_bytes() == b"new soft"


def test_an_existing_target_is_merged_into_and_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "target"
    (target / "d").mkdir(parents=True)
    target.chmod(0o751)
    (target / "d" / "kept").write_text("kept")
    (target / "other").write_text("other")
    archive = write_tar(
        tmp_path / "a.tar",
        [entry("d", tarfile.DIRTYPE), entry("d/new", data=b"new"), entry("top", data=b"top")],
    )
    extract_archive(archive, target, mode=None)
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == [
        "d",
        "d/kept",
        "d/new",
        "other",
        "top",
    ]
    assert stat.S_IMODE(target.stat().st_mode) == 0o751
    extract_archive(archive, target, mode=0o750)
    assert stat.S_IMODE(target.stat().st_mode) == 0o750


def _target_in_the_way(tmp_path: Path) -> Path:
    target = tmp_path / "target"
    (target / "a").mkdir(parents=True)
    (target / "a" / "f").write_text("old a/f")
    (target / "b" / "c").mkdir(parents=True)
    (target / "b" / "c" / "d").write_text("a file where the archive has a directory")
    (target / "b" / "e").mkdir()
    os.utime(target / "a", (1_500_000_000, 1_500_000_000))
    return target


@pytest.mark.parametrize(
    ("blocker", "what"),
    [
        (
            entry("b/c/d/deeper", data=b"x"),
            "a file or symbolic link is where the archive has a directory",
        ),
        (entry("b/e", data=b"x"), "a directory is where the archive has a file or link"),
    ],
)
def test_something_in_the_way_deep_in_the_target_leaves_it_exactly_as_it_was(
    tmp_path: Path, blocker: tuple[tarfile.TarInfo, bytes | None], what: str
) -> None:
    target = _target_in_the_way(tmp_path)
    before = snapshot(target)
    archive = write_tar(
        tmp_path / "a.tar",
        [
            entry("a/f", data=b"new a/f"),  # replaces an existing file (installed first)
            entry("a/g", data=b"new a/g"),  # a new file
            entry("aa/h", data=b"new dir"),  # a new directory
            blocker,
            entry("z", data=b"z"),  # never reached
        ],
    )
    where = target / blocker[0].name
    where = where if "deeper" not in blocker[0].name else where.parent
    with pytest.raises(TransferError) as caught:
        extract_archive(archive, target, mode=0o700)
    assert str(caught.value) == (
        f"Installing into {target} failed on the host: {what} ({where}); "
        "the target was left as it was."
    )
    assert snapshot(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar", "target"]


def test_a_staging_failure_touches_neither_a_new_nor_an_existing_target(tmp_path: Path) -> None:
    too_long = "x" * 300  # a real OS limit: no name component above 255 bytes
    archive = write_tar(tmp_path / "a.tar", [entry("ok", data=b"ok"), entry(too_long, data=b"x")])
    new = tmp_path / "p1" / "p2" / "new"
    with pytest.raises(TransferError) as caught:
        extract_archive(archive, new, mode=0o750)
    assert str(caught.value) == (
        f"Extracting into {new} failed on the host: File name too long ({new / too_long}); "
        "the target was left as it was."
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar"]  # no parents left either
    existing = _target_in_the_way(tmp_path)
    before = snapshot(existing)
    with pytest.raises(TransferError, match=r"^Extracting into"):
        extract_archive(archive, existing, mode=0o750)
    assert snapshot(existing) == before
