"""Links in a sync out, on the emulator: a workspace with a virtualenv comes back whole, its
absolute and relative symlinks as symlinks (issue 21), and nothing already in the host target,
hard links included (issue 21, item 4), is ever written through."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from provider.errors import TransferError
from tests.driver.archive_helpers import snapshot
from tests.driver.conftest import Harness
from tests.driver.sync_helpers import WS, host_temp_leftovers, mapping, op, sh, sync_out

pytestmark = pytest.mark.anyio

VENV = f"""
set -e
mkdir -p {WS}/proj/.venv/bin {WS}/proj/.venv/lib/python3.11/site-packages/pkg
cd {WS}/proj/.venv
echo 'home = /usr/bin' > pyvenv.cfg
ln -s /usr/bin/python3 bin/python
ln -s python bin/python3
ln -s lib lib64
echo 'x = 1' > lib/python3.11/site-packages/pkg/__init__.py
printf '#!{WS}/proj/.venv/bin/python\\nimport pkg\\n' > bin/tool && chmod 755 bin/tool
ln -s ../../../etc/hostname {WS}/proj/up
echo main > {WS}/proj/main.py
"""


async def test_a_workspace_with_a_virtualenv_comes_back_with_its_links(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    await sh(h, lease, VENV)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("precious")
    host = tmp_path / "host"
    host.mkdir()
    before = snapshot(outside)
    result = await sync_out(h, lease, op(mapping(f"{WS}/proj", host / "proj", "directory")))
    assert result["operations"][0]["filesTransferred"] == 4
    venv = host / "proj" / ".venv"
    assert os.readlink(venv / "bin" / "python") == "/usr/bin/python3"
    assert os.readlink(venv / "bin" / "python3") == "python"
    assert os.readlink(venv / "lib64") == "lib"
    assert os.readlink(host / "proj" / "up") == "../../../etc/hostname"
    assert (venv / "lib64" / "python3.11" / "site-packages" / "pkg" / "__init__.py").exists()
    assert (host / "proj" / "main.py").read_text() == "main\n"
    assert snapshot(outside) == before
    assert host_temp_leftovers(host, host / "proj") == []

    # Again into the existing tree: the links are replaced by new links, never followed.
    result = await sync_out(h, lease, op(mapping(f"{WS}/proj", host / "proj", "directory")))
    assert os.readlink(venv / "bin" / "python") == "/usr/bin/python3"
    assert snapshot(outside) == before


async def test_a_directory_where_the_target_has_an_escaping_link_is_refused_not_followed(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    await sh(h, lease, f"mkdir -p {WS}/proj/out && echo bytes > {WS}/proj/out/keep")
    host = tmp_path / "host"
    outside = host / "outside"
    outside.mkdir(parents=True)
    target = host / "proj"
    target.mkdir()
    (target / "out").symlink_to(outside)  # planted by an earlier sync out, say
    before = snapshot(host)
    with pytest.raises(TransferError, match="a file or symbolic link is where the archive has"):
        await sync_out(h, lease, op(mapping(f"{WS}/proj", target, "directory")))
    assert list(outside.iterdir()) == []
    assert snapshot(host) == before


async def test_hard_links_in_the_target_are_replaced_never_written_through(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    await sh(
        h, lease, f"mkdir -p {WS}/repo/.git && echo new > {WS}/repo/.git/obj && echo new > {WS}/f"
    )
    source_repo = tmp_path / "source-repo"  # a `git clone` of a local repo shares its inodes
    source_repo.mkdir()
    (source_repo / "obj").write_text("source")
    (source_repo / "file").write_text("source")
    target = tmp_path / "clone"
    (target / ".git").mkdir(parents=True)
    (target / ".git" / "obj").hardlink_to(source_repo / "obj")
    (tmp_path / "single").hardlink_to(source_repo / "file")
    await sync_out(
        h,
        lease,
        op(
            mapping(f"{WS}/repo", target, "directory"),
            mapping(f"{WS}/f", tmp_path / "single"),
        ),
    )
    assert (target / ".git" / "obj").read_text() == "new\n"
    assert (tmp_path / "single").read_text() == "new\n"
    assert (source_repo / "obj").read_text() == "source"
    assert (source_repo / "file").read_text() == "source"
    assert (source_repo / "obj").stat().st_nlink == 1
    assert (source_repo / "file").stat().st_nlink == 1
