"""Durable lease state: poison marks survive a restart, and a crashed worker's leftovers
(running process trees, unfinished creates, host temp folders) are cleaned up by the next call
that carries the same API origin and key."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from provider.createos.client import CreateOSClient
from provider.driver.journal import LeaseJournal, current_owner, default_state_dir, owner_alive
from provider.driver.runtime import DriverRuntime
from provider.driver.service import DriverService
from provider.driver.tracker import ScopeKey
from provider.errors import RequestRefused
from tests.driver.conftest import SHAPE, Harness, unpaced_client

pytestmark = pytest.mark.anyio

DEAD_OWNER = "4194304:0"  # above the kernel's pid limit: never alive


def scope(lease_id: str = "sb_1") -> ScopeKey:
    return ScopeKey.build(
        company_id="c",
        environment_id="e",
        api_url="http://127.0.0.1:1",
        api_key="k",
        lease_id=lease_id,
    )


def crashed_writer(path: Path) -> LeaseJournal:
    """A second handle on the same journal that writes as a worker which has since died."""
    journal = LeaseJournal(path)
    journal.owner = DEAD_OWNER
    return journal


def restarted(h: Harness) -> DriverService:
    """A fresh worker (new tracker, new service) sharing the same state folder."""
    old = h.methods.runtime
    assert old.journal.path is not None
    runtime = DriverRuntime(
        client_factory=unpaced_client, environ={}, journal=LeaseJournal(old.journal.path)
    )
    return DriverService(runtime, notify=h.methods.notify, log=h.methods.log)


def test_journal_persists_and_never_stores_the_key(tmp_path: Path) -> None:
    path = tmp_path / "leases.sqlite3"
    first = LeaseJournal(path)
    first.mark_unconfirmed(scope())
    first.close()
    second = LeaseJournal(path)
    assert second.is_unconfirmed(scope())
    assert not second.is_unconfirmed(scope("sb_2"))
    second.clear_unconfirmed(scope())
    assert not second.is_unconfirmed(scope())
    assert (path.stat().st_mode & 0o777) == 0o600
    for file in tmp_path.iterdir():
        assert b"\x00k\x00" not in file.read_bytes()  # only the key's hash is stored


def test_owner_liveness() -> None:
    assert owner_alive(current_owner())
    assert not owner_alive(DEAD_OWNER)
    assert not owner_alive(f"{os.getpid()}:1")  # same pid, other start time: pid reused
    assert not owner_alive("garbage")


def test_state_folder_location() -> None:
    assert default_state_dir({"XDG_STATE_HOME": "/srv/state"}) == Path(
        "/srv/state/paperclip-createos"
    )
    assert default_state_dir({}).name == ".state"
    assert default_state_dir({"XDG_STATE_HOME": "relative"}).name == ".state"


def test_orphans_exclude_entries_of_live_workers(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    live = LeaseJournal(path)
    dead = crashed_writer(path)
    live.add_process(scope(), "proc_live")
    dead.add_process(scope(), "proc_dead")
    live.add_create("http://127.0.0.1:1", scope().key_hash, "pc-live")
    dead.add_create("http://127.0.0.1:1", scope().key_hash, "pc-dead")
    assert [o.process_id for o in live.orphan_processes(*_origin())] == ["proc_dead"]
    assert live.orphan_creates(*_origin()) == ["pc-dead"]


def _origin() -> tuple[str, str]:
    return "http://127.0.0.1:1", scope().key_hash


async def test_poisoned_lease_stays_refused_after_a_restart(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    await h.emulator.admin.add_fault("POST", r"/processes$", status=502)
    with pytest.raises(Exception, match="Destroy"):
        await h.methods.execute({**h.with_lease(lease, reuseLease=True), "command": "true"})
    fresh = restarted(h)
    with pytest.raises(RequestRefused, match=r"[Dd]estroy"):
        await fresh.execute({**h.with_lease(lease, reuseLease=True), "command": "true"})
    with pytest.raises(RequestRefused, match=r"[Dd]estroy"):
        await fresh.release(h.lease_ref(lease, reuseLease=True))
    receipt = await fresh.destroy(h.lease_ref(lease, reuseLease=True))
    assert receipt is not None and receipt["state"] == "destroyed"
    again = restarted(h)
    assert not again.runtime.journal.is_unconfirmed(
        ScopeKey.build(
            company_id=h.company_id,
            environment_id=h.environment_id,
            api_url=h.emulator.base_url,
            api_key="test-key",
            lease_id=lease["providerLeaseId"],
        )
    )


async def test_next_call_kills_a_crashed_workers_process_tree(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    sandbox_id = lease["providerLeaseId"]
    async with CreateOSClient(h.emulator.base_url, "test-key") as client:
        view = await client.create_process(
            sandbox_id, cmd="/bin/bash", args=["-c", "(sleep 300 &); sleep 300"]
        )
    assert await h.emulator.admin.live_process_count() == 1
    lease_scope = ScopeKey.build(
        company_id=h.company_id,
        environment_id=h.environment_id,
        api_url=h.emulator.base_url,
        api_key="test-key",
        lease_id=sandbox_id,
    )
    assert h.methods.runtime.journal.path is not None
    crashed_writer(h.methods.runtime.journal.path).add_process(lease_scope, view.process_id)
    fresh = restarted(h)
    result = await fresh.execute({**h.with_lease(lease), "command": "echo", "args": ["ok"]})
    assert result["stdout"] == "ok\n"
    assert await h.emulator.admin.live_process_count() == 0
    assert fresh.runtime.journal.orphan_processes(h.emulator.base_url, lease_scope.key_hash) == []
    deletes = [r for r in await h.emulator.admin.requests() if r["method"] == "DELETE"]
    assert any(view.process_id in r["path"] for r in deletes)


async def test_next_call_deletes_a_sandbox_from_a_crashed_acquire(harness: Harness) -> None:
    h = harness
    async with CreateOSClient(h.emulator.base_url, "test-key") as client:
        await client.create_sandbox(shape=SHAPE, name="pc-crashed", rootfs=None, region=None)
    assert h.methods.runtime.journal.path is not None
    key_hash = hashlib.sha256(b"test-key").hexdigest()
    crashed_writer(h.methods.runtime.journal.path).add_create(
        h.emulator.base_url, key_hash, "pc-crashed"
    )
    fresh = restarted(h)
    lease = await fresh.acquire({**h.call(), "runId": "r"})
    state = await h.emulator.admin.state()
    live = [s for s in state["sandboxes"] if s["status"] not in ("destroyed", "destroying")]
    assert [s["id"] for s in live] == [lease["providerLeaseId"]]
    assert fresh.runtime.journal.orphan_creates(h.emulator.base_url, key_hash) == []


async def test_next_call_removes_a_crashed_transfers_temp_folder(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    leftover = tmp_path / ".paperclip-createos-crashed"
    leftover.mkdir()
    (leftover / "data").write_bytes(b"partial download")
    assert h.methods.runtime.journal.path is not None
    crashed_writer(h.methods.runtime.journal.path).add_tempdir(leftover)
    fresh = restarted(h)
    lease = await fresh.acquire({**h.call(), "runId": "r"})
    assert not leftover.exists()
    await fresh.destroy(h.lease_ref(lease))
