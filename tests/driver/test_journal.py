"""Durable lease state: poison marks survive a restart, and a crashed worker's leftovers
(running process trees, unfinished creates, host temp folders) are cleaned up by the next call
that carries the same API origin and key."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from provider.createos.client import CreateOSClient
from provider.driver.core import journal as journal_module
from provider.driver.core import owners as owners_module
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.owners import (
    ABANDONED,
    Owner,
    ProcStat,
    current_owner,
    owner_alive,
    parse_owner,
    parse_proc_stat,
)
from provider.driver.core.runtime import DriverRuntime
from provider.driver.core.tracker import ScopeKey
from provider.driver.service import DriverService
from provider.errors import RequestRefused
from tests.driver.conftest import SHAPE, Harness, unpaced_client
from tests.driver.stream_helpers import token_carriers
from tests.processes import reap

pytestmark = pytest.mark.anyio

DEAD_OWNER = "4194304:0"  # above the kernel's pid limit: never alive
BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
# A comm that trips a parser splitting /proc/<pid>/stat at the first ")": it would read state Z.
HOSTILE_COMM = "w) Z 1 (x"


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


def proc_stat(pid: int) -> ProcStat:
    parsed = parse_proc_stat(Path(f"/proc/{pid}/stat").read_text())
    assert parsed is not None
    return parsed


def wait_for_state(pid: int, state: str, timeout_s: float = 20.0) -> ProcStat:
    deadline = time.monotonic() + timeout_s
    while (stat := proc_stat(pid)).state != state:
        assert time.monotonic() < deadline, f"pid {pid} never reached state {state}: {stat}"
        time.sleep(0.01)
    return stat


def test_current_owner_records_pid_start_time_and_boot_id() -> None:
    assert current_owner() == f"{os.getpid()}:{proc_stat(os.getpid()).start_time}:{BOOT_ID}"
    assert parse_owner(current_owner()) == Owner(
        os.getpid(), proc_stat(os.getpid()).start_time, BOOT_ID
    )


@contextmanager
def hostile_child() -> Iterator[subprocess.Popen[bytes]]:
    """A live child named HOSTILE_COMM that exits when its stdin closes; reaped on leaving."""
    script = f"open('/proc/self/comm', 'w').write({HOSTILE_COMM!r}); import sys; sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while HOSTILE_COMM not in Path(f"/proc/{child.pid}/stat").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield child
    finally:
        reap(child)


def test_a_live_process_is_alive_whatever_its_comm_holds() -> None:
    with hostile_child() as child:
        start = proc_stat(child.pid).start_time
        assert owner_alive(f"{child.pid}:{start}:{BOOT_ID}")
        assert owner_alive(f"{child.pid}:{start}")


def test_an_unreaped_zombie_owner_is_dead() -> None:
    """A SIGKILLed worker stays a zombie until its parent reaps it (PID 1 in a container may
    take its time): its /proc entry, start time included, is still there, yet it is dead."""
    with hostile_child() as child:
        assert child.stdin is not None
        start = proc_stat(child.pid).start_time
        legacy, owner = f"{child.pid}:{start}", f"{child.pid}:{start}:{BOOT_ID}"
        assert owner_alive(legacy)
        child.stdin.close()  # it exits; nobody reaps it (no wait/poll) until the block ends
        zombie = wait_for_state(child.pid, "Z")
        assert Path(f"/proc/{child.pid}").exists()
        assert zombie.start_time == start
        assert not owner_alive(legacy)
        assert not owner_alive(owner)
    assert not owner_alive(owner)  # reaped: no /proc entry left


def test_a_recorded_start_time_that_differs_means_a_reused_pid() -> None:
    start = proc_stat(os.getpid()).start_time
    other = str(int(start) + 1)
    assert owner_alive(f"{os.getpid()}:{start}:{BOOT_ID}")
    assert not owner_alive(f"{os.getpid()}:{other}:{BOOT_ID}")
    assert not owner_alive(f"{os.getpid()}:{other}")  # legacy format alike


def test_an_owner_recorded_before_a_reboot_is_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    start = proc_stat(os.getpid()).start_time
    before_reboot = f"{os.getpid()}:{start}:{uuid.uuid4()}"  # same pid and start tick by chance
    assert owner_alive(f"{os.getpid()}:{start}:{BOOT_ID}")
    assert not owner_alive(before_reboot)
    monkeypatch.setattr(owners_module, "_boot_id", lambda: None)
    assert owner_alive(before_reboot)  # no boot id to compare: judged by pid and start time


def test_old_format_and_malformed_owners_behave_as_documented() -> None:
    """Where the record cannot tell, alive: wrongly killing a live worker's command is worse
    than a cleanup that waits. What no worker writes is malformed, hence dead."""
    pid, start = os.getpid(), proc_stat(os.getpid()).start_time
    assert parse_owner(f"{pid}:{start}") == Owner(pid, start, None)
    assert owner_alive(f"{pid}:{start}")  # written before boot ids were recorded
    assert owner_alive(f"{pid}:None")  # an old worker that could not read its start time
    assert owner_alive(f"{pid}::")  # a worker without /proc
    assert owner_alive(f"{pid}:{start}:{BOOT_ID}:later-field")  # a later version's extra field
    malformed = ["garbage", "", ":", "0:1", "-1:1", "+1:1", f"{pid}", f"{pid}:soon"]
    malformed += [f"{pid}:-5:{BOOT_ID}", "1" * 5000 + ":1", f"{ABANDONED}1e99"]
    for owner in malformed:
        assert parse_owner(owner) is None, owner
        assert not owner_alive(owner), owner
    assert not owner_alive(DEAD_OWNER)  # well formed, no such process
    assert not owner_alive(f"{DEAD_OWNER}:{BOOT_ID}")


def test_proc_stat_parsing_splits_at_the_last_parenthesis() -> None:
    rest = ["S", *(str(field) for field in range(4, 53))]  # rest[i] holds field i + 3
    line = f"4242 ({HOSTILE_COMM}) {' '.join(rest)}\n"
    assert parse_proc_stat(line) == ProcStat(state="S", start_time="22")
    zombie = f"4242 (a b) (c)) Z {' '.join(rest[1:])}\n"
    assert parse_proc_stat(zombie) == ProcStat(state="Z", start_time="22")
    fields = " ".join(rest[1:])
    for malformed in ["", "4242 (x", "4242 x) S 1 2 3", "4242 (x) S 1 2", f"4242 (x) SS {fields}"]:
        assert parse_proc_stat(malformed) is None
    assert parse_proc_stat(f"4242 (x) {' '.join(rest[:19])} ticks 23") is None


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


def test_a_process_removal_skips_its_fsync_and_only_its_own(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    writer, reader = LeaseJournal(path), LeaseJournal(path)
    statements: list[str] = []
    writer._db.set_trace_callback(statements.append)
    writer.add_process(scope(), "cmd-1")
    writer.add_process(scope(), "cmd-2")
    assert not any("synchronous" in s for s in statements)  # FULL: synced commits
    writer.remove_process("cmd-1")
    removal = [s for s in statements if "synchronous" in s or s.startswith("DELETE")]
    assert removal == [
        "PRAGMA synchronous=NORMAL",
        "DELETE FROM main.processes WHERE process_id='cmd-1'",
        "PRAGMA synchronous=FULL",
    ]
    assert writer._db.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL again
    # Committed all the same: another connection sees the row gone.
    assert reader._select("SELECT process_id FROM {db}.processes") == [("cmd-2",)]


def _origin() -> tuple[str, str]:
    return "http://127.0.0.1:1", scope().key_hash


async def test_poisoned_lease_stays_refused_after_a_restart(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    # The command's exec answers 502 (it may have run), and so does the kill by its token.
    await h.emulator.admin.add_fault("POST", r"/exec$", times=2, status=502)
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


def scope_of(h: Harness, sandbox_id: str) -> ScopeKey:
    return ScopeKey.build(
        company_id=h.company_id,
        environment_id=h.environment_id,
        api_url=h.emulator.base_url,
        api_key="test-key",
        lease_id=sandbox_id,
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
    lease_scope = scope_of(h, sandbox_id)
    assert h.methods.runtime.journal.path is not None
    crashed_writer(h.methods.runtime.journal.path).add_process(lease_scope, view.process_id)
    fresh = restarted(h)
    result = await fresh.execute({**h.with_lease(lease), "command": "echo", "args": ["ok"]})
    assert result["stdout"] == "ok\n"
    assert await h.emulator.admin.live_process_count() == 0
    assert fresh.runtime.journal.orphan_processes(h.emulator.base_url, lease_scope.key_hash) == []
    deletes = [r for r in await h.emulator.admin.requests() if r["method"] == "DELETE"]
    assert any(view.process_id in r["path"] for r in deletes)


async def test_next_call_kills_a_crashed_workers_streamed_command_by_its_token(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    sandbox_id = lease["providerLeaseId"]
    token = uuid.uuid4().hex
    script = "(sleep 300 &); setsid sleep 301 & sleep 302"
    argv = [f"PAPERCLIP_CMD={token}", "/bin/bash", "-c", script]
    # The crashed worker's exec: started, its stream dropped (which kills nothing).
    async with (
        CreateOSClient(h.emulator.base_url, "test-key") as client,
        client.exec_stream(sandbox_id, "/usr/bin/env", argv),
    ):
        pass
    with anyio.fail_after(10):
        while len(await token_carriers(h, lease)) < 4:
            await anyio.sleep(0.05)
    lease_scope = scope_of(h, sandbox_id)
    assert h.methods.runtime.journal.path is not None
    crashed_writer(h.methods.runtime.journal.path).add_process(lease_scope, f"cmd:{token}")
    fresh = restarted(h)
    result = await fresh.execute({**h.with_lease(lease), "command": "echo", "args": ["ok"]})
    assert result["stdout"] == "ok\n"
    assert await token_carriers(h, lease) == []
    assert fresh.runtime.journal.orphan_processes(h.emulator.base_url, lease_scope.key_hash) == []


ZOMBIE_WRITER = """
import sys
from pathlib import Path
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.tracker import ScopeKey
path, process_id, *scope = sys.argv[1:]
LeaseJournal(Path(path)).add_process(ScopeKey(*scope), process_id)
print("journaled", flush=True)
"""


async def test_next_call_kills_the_tree_of_a_worker_left_as_a_zombie(harness: Harness) -> None:
    """The worker that journaled the process has exited but was not reaped: still a zombie."""
    h = harness
    lease = await h.acquire()
    sandbox_id = lease["providerLeaseId"]
    async with CreateOSClient(h.emulator.base_url, "test-key") as client:
        view = await client.create_process(sandbox_id, cmd="/bin/bash", args=["-c", "sleep 300"])
    lease_scope = scope_of(h, sandbox_id)
    path = h.methods.runtime.journal.path
    assert path is not None
    scope_fields = [
        lease_scope.company_id,
        lease_scope.environment_id,
        lease_scope.api_url,
        lease_scope.key_hash,
        lease_scope.lease_id,
    ]
    worker = subprocess.Popen(
        [sys.executable, "-c", ZOMBIE_WRITER, str(path), view.process_id, *scope_fields],
        stdout=subprocess.PIPE,
    )
    try:
        assert worker.stdout is not None
        assert await anyio.to_thread.run_sync(worker.stdout.read) == b"journaled\n"
        await anyio.to_thread.run_sync(wait_for_state, worker.pid, "Z")
        fresh = restarted(h)
        result = await fresh.execute({**h.with_lease(lease), "command": "echo", "args": ["ok"]})
        assert proc_stat(worker.pid).state == "Z"  # still unreaped during the whole call
    finally:
        reap(worker)
    assert result["stdout"] == "ok\n"
    assert await h.emulator.admin.live_process_count() == 0
    assert fresh.runtime.journal.orphan_processes(h.emulator.base_url, lease_scope.key_hash) == []


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


def test_kept_forks_are_scoped_and_capped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(journal_module, "KEPT_FORKS_CAP", 3)
    journal = LeaseJournal(tmp_path / "leases.sqlite3")
    for n in range(5):
        journal.add_kept_fork("tag-a", "key-1", f"sb_{n}")
    journal.add_kept_fork("tag-b", "key-1", "sb_other_env")
    journal.add_kept_fork("tag-a", "key-2", "sb_other_key")
    assert journal.kept_forks("tag-b") == {"sb_other_env"}
    # Another key's row of the same scope counts (a rotated key); the newest three rows in all.
    assert journal.kept_forks("tag-a") == {"sb_4", "sb_other_key"}
    journal.remove_kept_fork("sb_4")
    journal.close()
    assert LeaseJournal(tmp_path / "leases.sqlite3").kept_forks("tag-a") == {"sb_other_key"}
