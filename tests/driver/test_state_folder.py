"""The state folder: one per Paperclip instance (keyed by the host's PAPERCLIP_PLUGIN_ID) under
the account's state root, and the legacy journal every instance shared before, which each
instance keeps reading (and clearing) but never writes."""

from __future__ import annotations

import hashlib
import os
import pwd
import sqlite3
import stat
from pathlib import Path

import pytest

from provider.createos.client import CreateOSClient
from provider.driver.core import state_folder
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.runtime import DriverRuntime
from provider.driver.core.state_folder import (
    JOURNAL_NAME,
    STANDALONE,
    instance_dir,
    instance_name,
    open_journal,
    state_roots,
)
from provider.driver.core.tracker import ScopeKey
from provider.driver.service import DriverService
from tests.driver.conftest import SHAPE, Harness, unpaced_client

UUID_A = "6f1c2a43-8d0e-4a55-9d0b-2f5e8c4b7a10"
UUID_B = "0b9e7d21-3c4f-4e8a-b1d2-7a6c5e4f3d21"
DEAD_OWNER = "4194304:0"  # above the kernel's pid limit: never alive
ORIGIN = "http://127.0.0.1:1"


def scope(lease_id: str = "sb_1") -> ScopeKey:
    return ScopeKey.build(
        company_id="c", environment_id="e", api_url=ORIGIN, api_key="k", lease_id=lease_id
    )


def instance_env(tmp_path: Path, plugin_id: str, **more: str) -> dict[str, str]:
    return {"XDG_STATE_HOME": str(tmp_path / "state"), "PAPERCLIP_PLUGIN_ID": plugin_id, **more}


def crashed_legacy(root: Path) -> LeaseJournal:
    """The shared journal of an earlier version, written by a worker that has since died."""
    journal = LeaseJournal(root / JOURNAL_NAME)
    journal.owner = DEAD_OWNER
    return journal


def row_count(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        tables = ("unconfirmed", "processes", "creates", "tempdirs", "kept_forks")
        return sum(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables)


# --- where -----------------------------------------------------------------------------------


def test_state_roots_in_order() -> None:
    package_state = Path(state_folder.__file__).resolve().parents[2] / ".state"
    assert state_roots({"XDG_STATE_HOME": "/srv/state", "HOME": "/home/op"}) == [
        Path("/srv/state/paperclip-createos"),
        Path("/home/op/.local/state/paperclip-createos"),
        package_state,
    ]
    # No HOME (the host gives the worker none): the account's home, outside the package folder
    # that an upgrade replaces. A relative XDG_STATE_HOME is ignored, as docs/protocol.md says.
    account_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert state_roots({})[0] == account_home / ".local/state/paperclip-createos"
    assert state_roots({"XDG_STATE_HOME": "relative", "HOME": "/h"})[0] == Path(
        "/h/.local/state/paperclip-createos"
    )


def test_the_instance_folder_is_named_by_the_hosts_plugin_id() -> None:
    root = Path("/r")
    assert instance_dir(root, {"PAPERCLIP_PLUGIN_ID": UUID_A}) == root / "instances" / UUID_A
    assert instance_name({"PAPERCLIP_PLUGIN_ID": f" {UUID_B}\n"}) == UUID_B
    # Outside a host (no id, or a blank one): one folder of its own, never a host instance's.
    assert instance_name({}) == STANDALONE
    assert instance_name({"PAPERCLIP_PLUGIN_ID": "  "}) == STANDALONE


@pytest.mark.parametrize(
    "plugin_id", ["..", "../../etc", "a/b", ".hidden", "x" * 129, "id with space", "é"]
)
def test_an_id_that_is_no_plain_name_is_hashed(plugin_id: str) -> None:
    name = instance_name({"PAPERCLIP_PLUGIN_ID": plugin_id})
    assert name == "id-" + hashlib.sha256(plugin_id.encode()).hexdigest()[:32]
    assert instance_dir(Path("/r"), {"PAPERCLIP_PLUGIN_ID": plugin_id}).parent == Path(
        "/r/instances"
    )


def test_two_instances_get_two_journals_under_one_root(tmp_path: Path) -> None:
    first = open_journal(instance_env(tmp_path, UUID_A))
    second = open_journal(instance_env(tmp_path, UUID_B))
    root = tmp_path / "state" / "paperclip-createos"
    assert first.path == root / "instances" / UUID_A / JOURNAL_NAME
    assert second.path == root / "instances" / UUID_B / JOURNAL_NAME
    first.mark_unconfirmed(scope())
    first.add_create(ORIGIN, scope().key_hash, "pc-first")
    assert first.is_unconfirmed(scope())
    assert not second.is_unconfirmed(scope())  # another instance's poison mark is not ours
    first.owner = second.owner = DEAD_OWNER
    assert second.orphan_creates(ORIGIN, scope().key_hash) == []
    assert not (root / JOURNAL_NAME).exists()  # no legacy journal is made up
    private = [root, root / "instances", first.path.parent, second.path.parent]
    assert [stat.S_IMODE(folder.stat().st_mode) for folder in private] == [0o700] * 4
    files = sorted(root.rglob("leases.sqlite3*"))  # each journal with its -wal and -shm
    assert len(files) == 6
    assert {stat.S_IMODE(file.stat().st_mode) for file in files} == {0o600}
    first.close()
    second.close()


def test_the_journal_falls_back_to_the_next_writable_root(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a folder should be")
    env = {"XDG_STATE_HOME": str(blocked), "HOME": str(tmp_path / "home")}
    journal = open_journal({**env, "PAPERCLIP_PLUGIN_ID": UUID_A})
    root = tmp_path / "home/.local/state/paperclip-createos"
    assert journal.path == root / "instances" / UUID_A / JOURNAL_NAME
    assert journal.path.exists()
    journal.close()


# --- the legacy journal ----------------------------------------------------------------------


def test_every_instance_reads_and_clears_the_legacy_journal_but_never_writes_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "state" / "paperclip-createos"
    old = crashed_legacy(root)
    old.mark_unconfirmed(scope())
    old.add_process(scope(), "proc_old")
    old.add_create(ORIGIN, scope().key_hash, "pc-old")
    old.add_tempdir(tmp_path / ".paperclip-createos-old")
    old.add_kept_fork("tag-a", scope().key_hash, "sb_fork_old")
    old.close()
    before = row_count(root / JOURNAL_NAME)

    first = open_journal(instance_env(tmp_path, UUID_A))
    second = open_journal(instance_env(tmp_path, UUID_B))
    assert first.legacy == second.legacy == root / JOURNAL_NAME
    for journal in (first, second):  # an old entry is every instance's, as it was
        assert journal.is_unconfirmed(scope())
        assert [o.process_id for o in journal.orphan_processes(ORIGIN, scope().key_hash)] == [
            "proc_old"
        ]
        assert journal.orphan_creates(ORIGIN, scope().key_hash) == ["pc-old"]
        assert journal.orphan_tempdirs() == [tmp_path / ".paperclip-createos-old"]
        assert journal.kept_forks("tag-a") == {"sb_fork_old"}

    first.add_create(ORIGIN, scope().key_hash, "pc-new")
    first.add_kept_fork("tag-a", scope().key_hash, "sb_fork_new")
    first.mark_unconfirmed(scope("sb_new"))
    assert row_count(root / JOURNAL_NAME) == before  # new entries go to the instance only
    assert second.kept_forks("tag-a") == {"sb_fork_old"}

    first.clear_unconfirmed(scope())
    first.remove_process("proc_old")
    first.remove_create("pc-old")
    first.remove_tempdir(tmp_path / ".paperclip-createos-old")
    first.remove_kept_fork("sb_fork_old")
    assert row_count(root / JOURNAL_NAME) == 0  # handled by one instance: gone for all
    assert not second.is_unconfirmed(scope())
    assert second.orphan_creates(ORIGIN, scope().key_hash) == []
    assert first.kept_forks("tag-a") == {"sb_fork_new"}
    first.close()
    second.close()


def test_an_empty_legacy_journal_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "state" / "paperclip-createos"
    crashed_legacy(root).close()
    journal = open_journal(instance_env(tmp_path, UUID_A))
    assert journal.legacy is None
    journal.add_create(ORIGIN, scope().key_hash, "pc-new")
    assert row_count(root / JOURNAL_NAME) == 0
    assert row_count(root / "instances" / UUID_A / JOURNAL_NAME) == 1
    journal.close()


def test_an_unusable_legacy_journal_is_reported_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "state" / "paperclip-createos"
    root.mkdir(parents=True)
    (root / JOURNAL_NAME).write_bytes(b"not a database " * 100)
    journal = open_journal(instance_env(tmp_path, UUID_A))
    assert journal.legacy is None
    assert journal.path == root / "instances" / UUID_A / JOURNAL_NAME
    journal.add_create(ORIGIN, scope().key_hash, "pc-new")  # the instance journal works
    assert f"legacy lease journal {root / JOURNAL_NAME} is not read" in capsys.readouterr().err
    journal.close()


@pytest.mark.anyio
async def test_a_crashed_create_in_the_legacy_journal_is_deleted_after_the_upgrade(
    harness: Harness, tmp_path: Path
) -> None:
    """A sandbox created by a worker of the earlier version that died mid-acquire: the first
    call of the upgraded worker with that origin and key deletes it and clears the entry."""
    h = harness
    async with CreateOSClient(h.emulator.base_url, "test-key") as client:
        await client.create_sandbox(shape=SHAPE, name="pc-legacy", rootfs=None, region=None)
    root = tmp_path / "upgraded" / "paperclip-createos"
    key_hash = hashlib.sha256(b"test-key").hexdigest()
    crashed_legacy(root).add_create(h.emulator.base_url, key_hash, "pc-legacy")
    journal = open_journal({"XDG_STATE_HOME": str(root.parent), "PAPERCLIP_PLUGIN_ID": UUID_A})
    runtime = DriverRuntime(client_factory=unpaced_client, environ={}, journal=journal)
    upgraded = DriverService(runtime, notify=h.methods.notify, log=h.methods.log)

    lease = await upgraded.acquire({**h.call(), "runId": "r"})

    state = await h.emulator.admin.state()
    live = [s for s in state["sandboxes"] if s["status"] not in ("destroyed", "destroying")]
    assert [s["id"] for s in live] == [lease["providerLeaseId"]]
    assert row_count(root / JOURNAL_NAME) == 0
    await upgraded.destroy(h.lease_ref(lease))
    journal.close()
