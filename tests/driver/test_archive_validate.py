"""Validation (docs/protocol.md 5.7) and extraction of archives coming from the sandbox, with
crafted tars."""

from __future__ import annotations

import gzip
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from provider.driver.transfer.archive import (
    ArchiveRefused,
    build_directory_archive,
    extract_archive,
    validate_archive,
)
from provider.errors import TransferError
from tests.driver.archive_helpers import entry, write_tar

GIB = 1024**3


def refused(path: Path, **kwargs: int) -> str:
    with pytest.raises(ArchiveRefused) as info:
        validate_archive(path, **kwargs)
    message = str(info.value)
    assert "refused" in message
    return info.value.reason


# --- what passes -------------------------------------------------------------------------------


def test_gnu_tar_output_is_accepted_and_counted(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d" / "e").mkdir(parents=True)
    (src / "a").write_text("a")
    (src / "d" / "e" / "b").write_text("b")
    (src / "d" / "hard").hardlink_to(src / "a")
    (src / "l").symlink_to("d/e/b")
    (src / "up").symlink_to("d/..")
    (src / "d" / "e" / "rel").symlink_to("../../a")
    (src / ("x" * 120)).write_text("long name")
    for fmt in ("gnu", "pax", "ustar"):
        archive = tmp_path / f"{fmt}.tar"
        cmd = ["tar", f"--format={fmt}", "-cf", str(archive), "-C", str(src), "."]
        if fmt == "ustar":
            (src / ("x" * 120)).unlink()
        subprocess.run(cmd, check=True)
        expected = 2 if fmt == "ustar" else 3  # the hard link is not a regular member
        assert validate_archive(archive) == expected
        out = tmp_path / f"out-{fmt}"
        assert extract_archive(archive, out, mode=None) == expected
        assert (out / "d" / "hard").read_text() == "a"
        assert os.readlink(out / "l") == "d/e/b"


def test_old_style_regular_members_count(tmp_path: Path) -> None:
    archive = write_tar(
        tmp_path / "a.tar",
        [entry("./x", tarfile.AREGTYPE, data=b"1"), entry("./y", data=b"22")],
        fmt=tarfile.GNU_FORMAT,
    )
    assert validate_archive(archive) == 2


def test_declared_total_at_the_limit_passes_and_above_fails(tmp_path: Path) -> None:
    archive = write_tar(
        tmp_path / "a.tar", [entry("a", data=b"x" * 600), entry("b", data=b"y" * 400)]
    )
    assert validate_archive(archive, max_total=1000) == 2
    assert refused(archive, max_total=999) == "declared sizes exceed the limit"


# --- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "../evil",
        "./../evil",
        "a/../../evil",
        "a/..",
        "/etc/passwd",
        "//abs",
        "a\\..\\evil",
        "back\\slash",
    ],
)
def test_unsafe_names_are_refused(tmp_path: Path, name: str) -> None:
    archive = write_tar(tmp_path / "a.tar", [entry("ok", data=b"1"), entry(name, data=b"2")])
    refused(archive)


def test_nul_in_a_pax_name_is_refused(tmp_path: Path) -> None:
    info = tarfile.TarInfo("placeholder")
    info.pax_headers = {"path": "a\0b"}
    archive = write_tar(tmp_path / "a.tar", [(info, b"")])
    refused(archive)


def test_duplicate_and_nested_under_file_names_are_refused(tmp_path: Path) -> None:
    dup = write_tar(tmp_path / "dup.tar", [entry("a", data=b"1"), entry("./a", data=b"2")])
    assert refused(dup) == "a member name appears twice"
    dirs = write_tar(
        tmp_path / "dirs.tar",
        [entry("d", tarfile.DIRTYPE), entry("./d/", tarfile.DIRTYPE), entry("d/f")],
    )
    assert validate_archive(dirs) == 1
    under_file = write_tar(tmp_path / "uf.tar", [entry("f", data=b"1"), entry("f/x")])
    assert refused(under_file) == "a member lies below a link or a file"


def test_members_are_extracted_under_their_canonical_names(tmp_path: Path) -> None:
    archive = write_tar(
        tmp_path / "a.tar",
        [
            entry("a//b/./c", data=b"c"),
            entry("link/.", tarfile.SYMTYPE, linkname="./a//b/.."),
            entry("./h", tarfile.LNKTYPE, linkname="./a/b//c"),
        ],
    )
    assert validate_archive(archive) == 1
    out = tmp_path / "out"
    extract_archive(archive, out, mode=None)
    assert (out / "a" / "b" / "c").read_text() == "c"
    assert os.readlink(out / "link") == "./a//b/.."
    assert (out / "h").read_text() == "c"


def test_root_member_must_be_a_directory(tmp_path: Path) -> None:
    ok = write_tar(tmp_path / "ok.tar", [entry("./", tarfile.DIRTYPE), entry("./a")])
    assert validate_archive(ok) == 1
    bad = write_tar(tmp_path / "bad.tar", [entry(".", data=b"x")])
    refused(bad)


# --- types -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind",
    [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE, tarfile.CONTTYPE, b"V", b"X", b"Z"],
)
def test_special_member_types_are_refused(tmp_path: Path, kind: bytes) -> None:
    info, data = entry("special", kind)
    if kind == tarfile.CONTTYPE:
        info.size = 1
        data = b"c"
    archive = write_tar(tmp_path / "a.tar", [entry("ok", data=b"1"), (info, data)])
    refused(archive)


def test_gnu_sparse_member_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with (src / "holes").open("wb") as handle:
        handle.seek(8 << 20)
        handle.write(b"end")
    for fmt in ("gnu", "pax"):
        archive = tmp_path / f"sparse-{fmt}.tar"
        subprocess.run(
            ["tar", "--sparse", f"--format={fmt}", "-cf", str(archive), "-C", str(src), "."],
            check=True,
        )
        assert refused(archive) in {"sparse member", "member type b'S' is not allowed"}


def test_pax_sparse_keys_are_refused(tmp_path: Path) -> None:
    info = tarfile.TarInfo("x")
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}
    archive = write_tar(tmp_path / "a.tar", [(info, b"")])
    refused(archive)


# --- links -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("escape", "../../outside"),
        ("escape", ".."),
        ("sub/escape", "../../outside"),
        ("abs", "/etc/passwd"),
        ("a/b/c/up", "../../../../x"),
    ],
)
def test_symlinks_leaving_the_root_are_kept_as_names(
    tmp_path: Path, name: str, target: str
) -> None:
    """A symlink is only a name: nothing lies below one and nothing follows one (module doc)."""
    archive = write_tar(
        tmp_path / "a.tar",
        [entry("sub", tarfile.DIRTYPE), entry(name, tarfile.SYMTYPE, linkname=target)],
    )
    assert validate_archive(archive) == 0


@pytest.mark.parametrize(("name", "target"), [("empty", ""), ("bs", "..\\outside")])
def test_empty_or_backslash_symlinks_are_refused_and_named(
    tmp_path: Path, name: str, target: str
) -> None:
    archive = write_tar(tmp_path / "a.tar", [entry(name, tarfile.SYMTYPE, linkname=target)])
    refused(archive)
    with pytest.raises(ArchiveRefused, match=rf"\(refused entry: '{name}'\)$"):
        validate_archive(archive)


def test_a_member_below_an_escaping_link_is_refused_and_named(tmp_path: Path) -> None:
    archive = write_tar(
        tmp_path / "a.tar",
        [entry("out", tarfile.SYMTYPE, linkname="/etc"), entry("out/passwd", data=b"x")],
    )
    assert refused(archive) == "a member lies below a link or a file"
    with pytest.raises(ArchiveRefused, match=r"\(refused entry: 'out/passwd'\)$"):
        validate_archive(archive)


@pytest.mark.parametrize(
    "target", ["../outside", "/etc/passwd", "", "missing", "a/../../x", "d/../a", "dir", "sym"]
)
def test_bad_hard_links_are_refused(tmp_path: Path, target: str) -> None:
    archive = write_tar(
        tmp_path / "a.tar",
        [
            entry("a", data=b"a"),
            entry("dir", tarfile.DIRTYPE),
            entry("sym", tarfile.SYMTYPE, linkname="a"),
            entry("hard", tarfile.LNKTYPE, linkname=target),
        ],
    )
    refused(archive)


def test_hard_link_to_an_earlier_member_passes(tmp_path: Path) -> None:
    archive = write_tar(
        tmp_path / "a.tar",
        [entry("d/a", data=b"a"), entry("h", tarfile.LNKTYPE, linkname="./d//a")],
    )
    assert validate_archive(archive) == 1
    out = tmp_path / "out"
    extract_archive(archive, out, mode=None)
    assert (out / "h").read_text() == "a"


def test_symlink_chains_and_loops_are_kept_as_names(tmp_path: Path) -> None:
    # On disk x resolves above the root, a and b loop: harmless, nothing is created below them.
    archive = write_tar(
        tmp_path / "a.tar",
        [
            entry("x", tarfile.SYMTYPE, linkname="d/e/f/g/.."),
            entry("d/e/f", tarfile.DIRTYPE),
            entry("d/e/f/g", tarfile.SYMTYPE, linkname="../../.."),
            entry("a", tarfile.SYMTYPE, linkname="b/x"),
            entry("b", tarfile.SYMTYPE, linkname="a/y"),
        ],
    )
    assert validate_archive(archive) == 0


def test_members_below_a_symlink_are_refused(tmp_path: Path) -> None:
    archive = write_tar(
        tmp_path / "a.tar",
        [
            entry("sub", tarfile.DIRTYPE),
            entry("l", tarfile.SYMTYPE, linkname="sub"),
            entry("l/file", data=b"through the link"),
        ],
    )
    assert refused(archive) == "a member lies below a link or a file"


def test_inside_links_pass(tmp_path: Path) -> None:
    archive = write_tar(
        tmp_path / "a.tar",
        [
            entry("a/b/f", data=b"f"),
            entry("a/b/up", tarfile.SYMTYPE, linkname="../.."),
            entry("a/b/dangling", tarfile.SYMTYPE, linkname="nothing/here"),
            entry("root-link", tarfile.SYMTYPE, linkname="."),
            entry("via", tarfile.SYMTYPE, linkname="a/b/up/a/b/f"),
        ],
    )
    assert validate_archive(archive) == 1


# --- sizes, corruption -------------------------------------------------------------------------


def test_declared_size_over_10_gib_is_refused(tmp_path: Path) -> None:
    info = tarfile.TarInfo("huge")
    info.size = 11 * GIB
    archive = tmp_path / "huge.tar"
    archive.write_bytes(info.tobuf(tarfile.PAX_FORMAT) + b"x" * 4096)
    assert refused(archive) == "declared sizes exceed the limit"
    gnu = tmp_path / "huge-gnu.tar"
    gnu.write_bytes(info.tobuf(tarfile.GNU_FORMAT) + b"x" * 4096)
    assert refused(gnu) == "declared sizes exceed the limit"


def test_several_members_summing_over_10_gib_are_refused(tmp_path: Path) -> None:
    # Three members of 4 GiB each whose bodies are holes of a sparse file (no real 12 GiB on
    # disk): each is complete on its own, the running total passes 10 GiB at the third.
    archive = tmp_path / "sum.tar"
    body = 4 * GIB
    with archive.open("wb") as handle:
        for index, name in enumerate(("a", "b", "c")):
            info = tarfile.TarInfo(name)
            info.size = body
            handle.seek(index * (512 + body))
            handle.write(info.tobuf(tarfile.PAX_FORMAT))
        handle.truncate(3 * (512 + body) + 1024)
    if archive.stat().st_blocks * 512 > 64 * 1024 * 1024:
        pytest.skip("this filesystem does not keep holes")
    assert archive.stat().st_size > 10 * GIB
    assert refused(archive) == "declared sizes exceed the limit"
    assert validate_archive(archive, max_total=12 * GIB) == 3


def test_truncated_member_data_is_refused(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "a.tar", [entry("a", data=b"z" * 5000)])
    whole = archive.read_bytes()
    archive.write_bytes(whole[:2048])
    assert refused(archive) in {
        "a member's data runs past the end of the file",
        "not a valid tar archive (ReadError)",
    }


def test_missing_end_marker_is_refused(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "a.tar", [entry("a", data=b"z" * 10)])
    archive.write_bytes(archive.read_bytes()[:1024])
    assert refused(archive) == "the end-of-archive marker is missing"


def test_corrupt_header_in_the_middle_is_refused(tmp_path: Path) -> None:
    archive = write_tar(
        tmp_path / "a.tar", [entry("a", data=b"1" * 10), entry("b", data=b"2" * 10)]
    )
    data = bytearray(archive.read_bytes())
    second = data.find(b"b\0", 512)
    data[second + 100] ^= 0xFF  # break the second header's checksum
    archive.write_bytes(bytes(data))
    refused(archive)


def test_garbage_after_the_end_marker_is_refused(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "a.tar", [entry("a", data=b"1")])
    archive.write_bytes(archive.read_bytes() + b"trailing junk")
    refused(archive)


@pytest.mark.parametrize("payload", [b"", b"not a tar at all" * 100, os.urandom(10240)])
def test_non_archives_are_refused(tmp_path: Path, payload: bytes) -> None:
    archive = tmp_path / "x.tar"
    archive.write_bytes(payload)
    refused(archive)


def test_compressed_archives_are_refused(tmp_path: Path) -> None:
    plain = write_tar(tmp_path / "a.tar", [entry("a", data=b"1")])
    packed = tmp_path / "a.tar.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    refused(packed)


def test_huge_extended_header_is_refused_without_reading_it(tmp_path: Path) -> None:
    header = tarfile.TarInfo("././@PaxHeader")
    header.type = tarfile.XHDTYPE
    header.size = 64 * 1024 * 1024
    archive = tmp_path / "a.tar"
    with archive.open("wb") as handle:
        handle.write(header.tobuf(tarfile.USTAR_FORMAT))
        handle.truncate(512 + header.size + 1024)
    assert refused(archive) == "an extended header is too large"


def test_refusal_message_names_the_entry_on_one_line(tmp_path: Path) -> None:
    name = "evil\nline-" + "x" * 300 + "/../../x"
    archive = write_tar(tmp_path / "a.tar", [entry(name, data=b"1")])
    with pytest.raises(ArchiveRefused) as info:
        validate_archive(archive)
    message = str(info.value)
    assert message.endswith(f"(refused entry: {name[:200]!r})")  # repr: no raw newline
    assert "\n" not in message and info.value.reason == "a member name has a '..' segment"
    assert isinstance(info.value, TransferError)


def test_unreadable_archive_is_a_transfer_error(tmp_path: Path) -> None:
    with pytest.raises(TransferError):
        validate_archive(tmp_path / "missing.tar")


# --- extraction --------------------------------------------------------------------------------


def test_refused_archive_never_creates_the_target(tmp_path: Path) -> None:
    archive = write_tar(
        tmp_path / "a.tar",
        [entry("keep", data=b"k"), entry("escape/../../outside", data=b"x")],
    )
    target = tmp_path / "new" / "deeper" / "target"
    with pytest.raises(ArchiveRefused):
        extract_archive(archive, target, mode=0o700)
    assert not (tmp_path / "new").exists()


def test_symlink_target_directory_is_refused(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "a.tar", [entry("file", data=b"data")])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = tmp_path / "target"
    target.symlink_to(elsewhere)
    with pytest.raises(TransferError, match="symbolic link"):
        extract_archive(archive, target, mode=None)
    assert list(elsewhere.iterdir()) == []
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(TransferError, match="symbolic link"):
        extract_archive(archive, dangling, mode=None)
    assert not (tmp_path / "nowhere").exists()


def test_file_target_is_refused(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "a.tar", [entry("file", data=b"data")])
    target = tmp_path / "target"
    target.write_text("keep me")
    with pytest.raises(TransferError):
        extract_archive(archive, target, mode=None)
    assert target.read_text() == "keep me"


def test_extraction_modes(tmp_path: Path) -> None:
    archive = write_tar(
        tmp_path / "a.tar",
        [
            entry("exec", data=b"#!", mode=0o4777),
            entry("private", data=b"p", mode=0o000),
            entry("d", tarfile.DIRTYPE, mode=0o777),
        ],
    )
    created = tmp_path / "p1" / "p2" / "t"
    extract_archive(archive, created, mode=0o750)
    assert stat.S_IMODE(created.stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "p1").stat().st_mode) == 0o750
    # The data filter drops special bits and group/other write, and gives owner read/write.
    assert stat.S_IMODE((created / "exec").stat().st_mode) == 0o755
    assert stat.S_IMODE((created / "private").stat().st_mode) == 0o600
    default = tmp_path / "q1" / "t"
    extract_archive(archive, default, mode=None)
    assert stat.S_IMODE(default.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "q1").stat().st_mode) == 0o700
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    existing.chmod(0o755)
    extract_archive(archive, existing, mode=None)
    assert stat.S_IMODE(existing.stat().st_mode) == 0o755


def test_existing_link_inside_the_target_is_not_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "pre").symlink_to(outside)
    (target / "pre-file").symlink_to(outside / "f")
    archive = write_tar(tmp_path / "a.tar", [entry("pre/x", data=b"x")])
    with pytest.raises(TransferError, match="is where the archive has a directory"):
        extract_archive(archive, target, mode=None)
    # A file member replaces the link itself (a new inode), never what it points at.
    archive = write_tar(tmp_path / "b.tar", [entry("pre-file", data=b"x")])
    extract_archive(archive, target, mode=None)
    assert not (target / "pre-file").is_symlink()
    assert (target / "pre-file").read_bytes() == b"x"
    assert list(outside.iterdir()) == []


def test_round_trip_through_gnu_tar(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "node_modules").mkdir(parents=True)
    (src / "node_modules" / "m").write_text("m")
    (src / "keep").write_text("keep")
    (src / "keep").chmod(0o600)
    (src / "link").symlink_to("keep")
    archive = tmp_path / "a.tar"
    subprocess.run(
        ["tar", "--exclude=node_modules", "-cf", str(archive), "-C", str(src), "."], check=True
    )
    out = tmp_path / "out"
    assert extract_archive(archive, out, mode=None) == 1
    assert sorted(p.name for p in out.iterdir()) == ["keep", "link"]
    assert stat.S_IMODE((out / "keep").stat().st_mode) == 0o600
    assert os.readlink(out / "link") == "keep"
    # And the host-built archive is read by GNU tar the same way.
    ours = tmp_path / "ours.tar"
    build_directory_archive(src, ours, exclude=["node_modules"], follow_symlinks=False)
    listing = subprocess.run(
        ["tar", "-tvf", str(ours)], check=True, capture_output=True, text=True
    ).stdout
    assert "./keep" in listing and "./link -> keep" in listing and "node_modules" not in listing
