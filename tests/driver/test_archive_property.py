"""Property: extracting any archive (refused or not) never writes outside the destination."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from provider.driver.transfer.archive import extract_archive, validate_archive
from provider.errors import TransferError

DEPTH = 40  # the destination sits this deep, so even long ".." chains stay inside the sandbox dir

# Link targets come from a hostile alphabet; member names are mostly plausible (so that a fair
# share of archives passes validation and is really extracted) and sometimes hostile too.
hostile_segment = st.sampled_from(["a", "b", "..", "..", ".", "", "pre", "pre-file", "c\\d", "ü"])
benign_segment = st.sampled_from(["a", "a", "b", "b", "c", ".", "pre", "pre-file", "ü"])


def path_of(parts: st.SearchStrategy[str], prefixes: list[str]) -> st.SearchStrategy[str]:
    return st.builds(
        lambda prefix, items: prefix + "/".join(items),
        st.sampled_from(prefixes),
        st.lists(parts, min_size=1, max_size=4),
    )


hostile_path = path_of(hostile_segment, ["", "", "./", "/", "../"])
member_name = st.one_of(
    path_of(benign_segment, ["", "./"]), path_of(benign_segment, ["", "./"]), hostile_path
)
kind = st.sampled_from(
    [tarfile.REGTYPE] * 4
    + [tarfile.DIRTYPE] * 2
    + [tarfile.SYMTYPE] * 4
    + [tarfile.LNKTYPE] * 2
    + [tarfile.FIFOTYPE]
)
member = st.tuples(member_name, kind, hostile_path)


def build_archive(path: Path, members: list[tuple[str, bytes, str]]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, type_, linkname in members:
            info = tarfile.TarInfo(name)
            info.type = type_
            info.mode = 0o644
            data = None
            if type_ == tarfile.REGTYPE:
                payload = b"written:" + name.encode()
                info.size = len(payload)
                data = io.BytesIO(payload)
            elif type_ in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = linkname
            tf.addfile(info, data)


def snapshot(top: Path, skip: Path) -> set[str]:
    """Every path under ``top`` (links not followed), except the subtree ``skip``."""
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        if here == skip:
            dirnames.clear()
            continue
        for name in dirnames + filenames:
            seen.add(str((here / name).relative_to(top)))
    return seen


@settings(
    max_examples=int(os.environ.get("ARCHIVE_PROPERTY_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(st.lists(member, min_size=1, max_size=6), st.booleans())
# Found by this test: a link named "x/." once made tarfile recurse without end.
@example([("a/pre/pre-file/.", tarfile.SYMTYPE, "./ü//..")], False)
@example([("a", tarfile.SYMTYPE, "."), ("a/b", tarfile.REGTYPE, "")], True)
@example([("x", tarfile.SYMTYPE, "pre/../.."), ("pre/f", tarfile.REGTYPE, "")], True)
def test_nothing_is_written_outside_the_destination(
    members: list[tuple[str, bytes, str]], pre_existing: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        top = Path(tmp)
        nest = top.joinpath(*(["n"] * DEPTH))
        outside = nest / "outside"
        dest = nest / "dest"
        outside.mkdir(parents=True)
        dest.mkdir()
        if pre_existing:
            (dest / "pre").symlink_to("../outside")
            (dest / "pre-file").symlink_to("../outside/file")
        archive = top / "archive.tar"
        build_archive(archive, members)
        before = snapshot(top, dest)

        try:
            validate_archive(archive)
            valid = True
        except TransferError:
            valid = False
        try:
            extract_archive(archive, dest, mode=None)
            extracted = True
        except TransferError:
            extracted = False

        assert not extracted or valid
        event(f"valid={valid} extracted={extracted}")
        assert list(outside.iterdir()) == []
        assert snapshot(top, dest) == before
        # Links may point anywhere (they are names, never followed), but each one the
        # extraction created is exactly an archived link, and nothing lies below one.
        archived = {target for _, type_, target in members if type_ == tarfile.SYMTYPE}
        for dirpath, dirnames, filenames in os.walk(dest):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                if path.is_symlink() and path.parent == dest and name in ("pre", "pre-file"):
                    continue
                if path.is_symlink():
                    assert os.readlink(path) in archived, (name, os.readlink(path))
