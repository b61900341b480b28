"""Property: extracting into an existing target gives the old tree overlaid with the archive,
or, when something is in the way, leaves the target exactly as it was (inodes and times too)."""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from provider.driver.transfer.archive import extract_archive
from provider.errors import TransferError
from tests.driver.archive_helpers import Member, entry, snapshot, write_tar

Tree = dict[str, Any]  # name -> subtree (a directory), or ("file", bytes) / ("link", text)
name = st.sampled_from(["a", "b", "c"])
leaf = st.one_of(
    st.tuples(st.just("file"), st.binary(max_size=6)),
    st.tuples(st.just("link"), st.sampled_from([".", "x", "y/z"])),  # never a loop
)
tree: st.SearchStrategy[Tree] = st.recursive(
    st.dictionaries(name, leaf, max_size=3),
    lambda inner: st.dictionaries(name, st.one_of(leaf, inner), max_size=3),
    max_leaves=10,
)


def flat(node: Tree, prefix: str = "") -> dict[str, Any]:
    """path -> "dir" or ("file", bytes) or ("link", text), parents before children."""
    out: dict[str, Any] = {}
    for key, value in sorted(node.items()):
        path = prefix + key
        out[path] = "dir" if isinstance(value, dict) else value
        if isinstance(value, dict):
            out.update(flat(value, path + "/"))
    return out


def create(root: Path, entries: dict[str, Any]) -> None:
    for path, value in entries.items():
        where = root / path
        if value == "dir":
            where.mkdir()
        elif value[0] == "file":
            where.write_bytes(value[1])
        else:
            where.symlink_to(value[1])


def members(entries: dict[str, Any]) -> list[Member]:
    out = []
    for path, value in entries.items():
        if value == "dir":
            out.append(entry(path, tarfile.DIRTYPE, mode=0o755))
        elif value[0] == "file":
            out.append(entry(path, data=value[1]))
        else:
            out.append(entry(path, tarfile.SYMTYPE, linkname=value[1]))
    return out


def in_the_way(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """A path that is a directory on one side and not on the other (below such a path the
    old tree has nothing, so the first clash is always at a path both sides name)."""
    return any(
        path in old and (old[path] == "dir") != (value == "dir") for path, value in new.items()
    )


def content(root: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for path, (kind, _mode, data, *_rest) in snapshot(root, inodes=False).items():
        found[path] = (
            "dir" if kind == 0o040000 else (("link" if isinstance(data, str) else "file"), data)
        )
    return found


@settings(max_examples=150, deadline=None)
@given(old=tree, new=tree)
def test_an_existing_target_is_overlaid_or_left_exactly_as_it_was(old: Tree, new: Tree) -> None:
    old_entries, new_entries = flat(old), flat(new)
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        target = base / "target"
        target.mkdir()
        create(target, old_entries)
        archive = write_tar(base / "a.tar", members(new_entries))
        before = snapshot(target)
        if in_the_way(old_entries, new_entries):
            event("something in the way")
            try:
                extract_archive(archive, target, mode=None)
            except TransferError as exc:
                assert "is where the archive has" in str(exc)
            else:
                raise AssertionError("the install should have failed")
            assert snapshot(target) == before
        else:
            event("overlaid")
            extract_archive(archive, target, mode=None)
            expected = {**old_entries, **new_entries}
            assert content(target) == dict(sorted(expected.items()))
        assert sorted(os.listdir(base)) == ["a.tar", "target"]
