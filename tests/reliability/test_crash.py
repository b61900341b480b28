"""Crash tests through the REAL Paperclip worker manager (@paperclipai/server 2026.916.1).

The Python worker (or the Node shim) is killed with SIGKILL while a command or a file transfer
is in flight. The manager restarts the worker (its own auto-restart, or stopWorker/startWorker),
and the next call that carries the lease's config must clean up what the dead worker left: no
process carrying a command token (``PAPERCLIP_CMD``, which names a streamed command's tree) in
the sandbox, no live process tree in the emulator and no ``.paperclip-createos-*`` folder on the
host. A streamed command is journaled as ``cmd:<token>`` before its exec is sent; the next call
kills by that token.

Where the worker's state goes: the manager builds the worker's environment as
``{...options.env, PATH, NODE_PATH, PAPERCLIP_PLUGIN_ID, NODE_ENV, TZ}`` (plugin-worker-manager.js
``spawnProcess``), so what a caller passes as ``env`` to ``startWorker`` does reach the worker; only
the server's *own* environment is scrubbed. Each test passes its own ``XDG_STATE_HOME`` (the journal
lands in ``<tmp>/state/paperclip-createos/instances/<plugin id>/leases.sqlite3``, never in a
default folder) and its own
``TMPDIR`` (the system temp folder of uploads, so other tests' transfers never show up in the
leftover check). ``PAPERCLIP_CREATEOS_PACE_MS`` shortens request pacing the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from devtools.call_params import bash, environment_call, with_lease
from devtools.host_peer import HostPeer
from devtools.peer_sessions import PeerCallError
from devtools.procfs import wait_until_gone
from provider.createos.client import CreateOSClient
from provider.createos.pacer import RequestPacer
from provider.driver.core.state_folder import ENV_PLUGIN_ID, JOURNAL_NAME, instance_dir, state_roots
from provider.emulator import Emulator
from provider.rpc.wire import WORKER_UNAVAILABLE
from tests.driver.stream_helpers import TREE_SCAN

pytestmark = [pytest.mark.anyio, pytest.mark.host]

CALL_TIMEOUT_MS = 120_000
EXIT_GUARD_S = 20.0
WS = "/paperclip-workspace"
# A command whose tree outlives its parent: a double-forked sleeper, a setsid one, a loop.
# (A ``setsid`` child would leave the session, which is what CreateOS calls the process tree.)
LONG_SCRIPT = "(sleep 300 &); (sleep 301 &); while true; do echo tick; sleep 0.2; done"
TEMP_PREFIX = ".paperclip-createos-"


@dataclass
class Rig:
    """The manager with a worker, the emulator, and the worker's private folders."""

    peer: HostPeer
    emulator: Emulator
    state_home: Path
    tmpdir: Path
    company_id: str = "company-crash"
    environment_id: str = "env-crash"
    outcomes: dict[str, Any] = field(default_factory=dict)

    @property
    def worker_env(self) -> dict[str, str]:
        return {
            "XDG_STATE_HOME": str(self.state_home),
            "TMPDIR": str(self.tmpdir),
            "PAPERCLIP_CREATEOS_PACE_MS": "20",
        }

    @property
    def journal_path(self) -> Path:
        root = self.state_home / "paperclip-createos"
        return instance_dir(root, {ENV_PLUGIN_ID: self.peer.plugin_id}) / JOURNAL_NAME

    async def start(self, *, auto_restart: bool) -> None:
        await self.peer.start_worker(env=self.worker_env, auto_restart=auto_restart)

    def common(self) -> dict[str, Any]:
        return environment_call(
            self.emulator.base_url,
            "test-key",
            company_id=self.company_id,
            environment_id=self.environment_id,
            timeoutMs=60_000,
        )

    async def call(self, method: str, params: dict[str, Any], **extra: Any) -> Any:
        return await self.peer.call(method, params, timeout_ms=CALL_TIMEOUT_MS, **extra)

    async def acquire(self) -> dict[str, Any]:
        lease: dict[str, Any] = await self.call(
            "environmentAcquireLease", {**self.common(), "runId": "run-crash"}
        )
        return lease

    def with_lease(self, lease: dict[str, Any]) -> dict[str, Any]:
        return with_lease(self.common(), lease)

    async def execute(self, lease: dict[str, Any], script: str, **extra: Any) -> dict[str, Any]:
        params = bash(self.with_lease(lease), script)
        result: dict[str, Any] = await self.call("environmentExecute", params, **extra)
        return result

    async def release(self, lease: dict[str, Any]) -> None:
        ref = {
            **self.common(),
            "providerLeaseId": lease["providerLeaseId"],
            "leaseMetadata": lease["metadata"],
        }
        receipt = await self.call("environmentReleaseLease", ref)
        assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}

    async def in_background(self, name: str, method: str, params: dict[str, Any]) -> None:
        """Run a call and keep its outcome (result or PeerCallError) under ``name``."""
        try:
            self.outcomes[name] = await self.call(method, params, on_log=lambda s, c: None)
        except PeerCallError as exc:
            self.outcomes[name] = exc

    def journal_rows(self, table: str) -> int:
        with sqlite3.connect(self.journal_path) as db:
            (count,) = db.execute(f"SELECT count(*) FROM {table}").fetchone()
        return int(count)

    def journaled_commands(self) -> list[str]:
        """The journaled processes: ``cmd:<token>`` for a streamed command."""
        with sqlite3.connect(self.journal_path) as db:
            return [row[0] for row in db.execute("SELECT process_id FROM processes")]

    async def live_trees(self) -> list[dict[str, Any]]:
        state = await self.emulator.admin.state()
        return [p for p in state["processes"] if p["tree_alive"]]

    async def kill_worker_and_wait(self, which: str) -> tuple[int, int]:
        """SIGKILL the Python worker or the shim; wait until both processes are gone."""
        shim, worker = self.peer.shim_pid(), self.peer.worker_pid()
        assert shim is not None and worker is not None
        os.kill(worker if which == "worker" else shim, signal.SIGKILL)
        assert await wait_until_gone(worker, EXIT_GUARD_S)
        assert await wait_until_gone(shim, EXIT_GUARD_S)
        return shim, worker

    async def restart_automatically(self, events_before: int) -> None:
        crash = await self.peer.wait_for_event("crash", after=events_before, timeout_s=30)
        assert crash.raw.get("willRestart") is True
        await self.peer.wait_for_event("ready", after=events_before, timeout_s=30)


def temp_leftovers(*folders: Path) -> list[Path]:
    return sorted(
        p for d in folders if d.exists() for p in d.iterdir() if p.name.startswith(TEMP_PREFIX)
    )


def default_state_rows(api_url: str) -> int:
    """Rows for this test's emulator in every journal of the default state roots (the
    account's home, the checkout's .state; legacy and per-instance): they must stay untouched."""
    rows = 0
    for root in state_roots({}):
        for path in [root / JOURNAL_NAME, *root.glob(f"instances/*/{JOURNAL_NAME}")]:
            if not path.exists():
                continue
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                for table in ("processes", "creates", "unconfirmed"):
                    query = f"SELECT count(*) FROM {table} WHERE api_url=?"
                    rows += db.execute(query, (api_url,)).fetchone()[0]
    return rows


@pytest.fixture
async def rig(emulator: Emulator, tmp_path: Path) -> AsyncIterator[Rig]:
    state_home, tmpdir = tmp_path / "state", tmp_path / "tmp"
    tmpdir.mkdir()
    async with HostPeer(log_file=tmp_path / "peer.log", cwd=tmp_path) as peer:
        rig = Rig(peer, emulator, state_home, tmpdir)
        try:
            yield rig
        finally:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(PeerCallError):
                    await peer.stop_worker()
    assert default_state_rows(emulator.base_url) == 0


async def sandbox_pids(rig: Rig, sandbox_id: str) -> set[int]:
    """Host pids of every process living in the sandbox (its supervisor included)."""
    for sandbox in (await rig.emulator.admin.state())["sandboxes"]:
        if sandbox["id"] == sandbox_id:
            return set(sandbox["host_pids"])
    raise AssertionError(f"sandbox {sandbox_id} is gone")


async def start_long_command(rig: Rig, tg: Any, lease: dict[str, Any]) -> list[str]:
    """Start LONG_SCRIPT as a host execute; return its token carriers once it streams."""
    ticks: list[str] = []
    params = {**rig.with_lease(lease), "command": "bash", "args": ["-c", LONG_SCRIPT]}

    async def run() -> None:
        try:
            rig.outcomes["execute"] = await rig.call(
                "environmentExecute", params, on_log=lambda stream, chunk: ticks.append(chunk)
            )
        except PeerCallError as exc:
            rig.outcomes["execute"] = exc

    tg.start_soon(run)
    with anyio.fail_after(60):
        while len(ticks) < 3:
            await anyio.sleep(0.05)
    carriers = await token_carriers(rig, lease["providerLeaseId"])
    assert_sleepers(carriers, "sleep 300", "sleep 301")
    [journaled] = rig.journaled_commands()  # journaled in the state folder we chose
    assert journaled.startswith("cmd:")
    return carriers


def assert_sleepers(carriers: list[str], *commands: str) -> None:
    """Each of ``commands`` (a whole command line) runs in the sandbox, carrying a token."""
    for command in commands:
        assert any(runs(line, command) for line in carriers), carriers


def runs(carrier: str, command: str) -> bool:
    """Whether a ``"<pid> <cmdline>"`` line of :func:`token_carriers` is ``command``."""
    return carrier.partition(" ")[2].strip() == command


def assert_worker_lost(outcome: object) -> None:
    assert isinstance(outcome, PeerCallError), outcome
    assert outcome.code == WORKER_UNAVAILABLE


async def test_worker_killed_during_execute_next_call_kills_the_orphan_tree(rig: Rig) -> None:
    await rig.start(auto_restart=True)
    lease = await rig.acquire()
    sandbox_id = lease["providerLeaseId"]
    baseline = await sandbox_pids(rig, sandbox_id)
    async with anyio.create_task_group() as tg:
        await start_long_command(rig, tg, lease)
        events_before = len(rig.peer.events)
        await rig.kill_worker_and_wait("worker")
    assert_worker_lost(rig.outcomes["execute"])
    await rig.restart_automatically(events_before)  # the manager's own crash recovery

    # Nobody else would ever stop it: the dead worker's tree still runs in the sandbox.
    assert_sleepers(await token_carriers(rig, sandbox_id), "sleep 300", "sleep 301")
    assert rig.journal_rows("processes") == 1

    after = await rig.execute(lease, "echo after")  # the next call carrying the lease's config
    assert (after["exitCode"], after["stdout"]) == (0, "after\n")
    assert await token_carriers(rig, sandbox_id) == []
    assert await rig.live_trees() == []
    assert await sandbox_pids(rig, sandbox_id) == baseline
    assert rig.journal_rows("processes") == 0
    assert rig.journal_rows("unconfirmed") == 0  # the kill was confirmed: the lease stays usable
    assert temp_leftovers(rig.tmpdir) == []
    await rig.release(lease)


async def test_shim_killed_during_execute_the_worker_stops_its_tree_and_exits(rig: Rig) -> None:
    await rig.start(auto_restart=True)
    lease = await rig.acquire()
    sandbox_id = lease["providerLeaseId"]
    baseline = await sandbox_pids(rig, sandbox_id)
    async with anyio.create_task_group() as tg:
        await start_long_command(rig, tg, lease)
        events_before = len(rig.peer.events)
        # SIGKILL to the shim: the worker gets SIGTERM (PR_SET_PDEATHSIG), aborts its work,
        # kills the tree by its token and exits; kill_worker_and_wait returns once both are gone.
        await rig.kill_worker_and_wait("shim")
    assert_worker_lost(rig.outcomes["execute"])
    assert await token_carriers(rig, sandbox_id) == []  # stopped by the dying worker itself
    assert rig.journal_rows("processes") == 0
    await rig.restart_automatically(events_before)

    after = await rig.execute(lease, "echo after")
    assert (after["exitCode"], after["stdout"]) == (0, "after\n")
    assert await token_carriers(rig, sandbox_id) == []
    assert await rig.live_trees() == []
    assert await sandbox_pids(rig, sandbox_id) == baseline
    assert temp_leftovers(rig.tmpdir) == []
    await rig.release(lease)


def sync_params(rig: Rig, lease: dict[str, Any], **operation: Any) -> dict[str, Any]:
    return {**rig.with_lease(lease), "operations": [{"operationId": "op-1", **operation}]}


def kill_when_partial(worker_pid: int, data_file: Path, total: int) -> int | None:
    """SIGKILL the worker once its download file holds some but not all bytes; the size seen.

    Called between event-loop turns: the emulator serves the download from this very loop, so
    no more bytes leave it between this check and the kill.
    """
    try:
        size = data_file.stat().st_size
    except FileNotFoundError:
        return None
    if size == 0:
        return None
    os.kill(worker_pid, signal.SIGKILL)
    return size


async def test_worker_killed_during_a_large_download_leaves_no_temp_files(
    rig: Rig, tmp_path: Path
) -> None:
    await rig.start(auto_restart=False)
    lease = await rig.acquire()
    total = 256 << 20
    made = await rig.execute(lease, f"truncate -s {total} {WS}/big.bin")
    assert made["exitCode"] == 0
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "big.bin"
    target.write_bytes(b"previous contents")
    mapping = {"sourcePath": f"{WS}/big.bin", "targetPath": str(target), "kind": "file"}
    worker_pid = rig.peer.worker_pid()
    assert worker_pid is not None
    seen: int | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            rig.in_background,
            "sync",
            "environmentSyncOut",
            sync_params(rig, lease, files=[mapping]),
        )
        with anyio.fail_after(120):
            while seen is None:
                assert "sync" not in rig.outcomes, rig.outcomes
                data_files = [d / "data" for d in temp_leftovers(out_dir)]
                if not data_files:
                    await anyio.sleep(0.01)
                    continue
                seen = kill_when_partial(worker_pid, data_files[0], total)
                await anyio.lowlevel.checkpoint()
    assert seen is not None and 0 < seen < total  # killed mid-transfer
    assert await wait_until_gone(worker_pid, EXIT_GUARD_S)
    assert_worker_lost(rig.outcomes["sync"])
    assert len(temp_leftovers(out_dir)) == 1  # what the crash left behind
    assert rig.journal_rows("tempdirs") == 1

    await rig.peer.stop_worker()  # restart by hand this time: stopWorker + startWorker
    await rig.start(auto_restart=False)
    after = await rig.execute(lease, "true")
    assert after["exitCode"] == 0
    assert temp_leftovers(out_dir, rig.tmpdir) == []
    assert target.read_bytes() == b"previous contents"  # only a complete download is renamed
    assert rig.journal_rows("tempdirs") == 0
    assert await rig.live_trees() == []
    await rig.release(lease)


async def test_worker_killed_during_an_upload_leaves_no_temp_files(
    rig: Rig, tmp_path: Path
) -> None:
    await rig.start(auto_restart=True)
    lease = await rig.acquire()
    source = tmp_path / "src"
    source.mkdir()
    for name in ("a.bin", "b.bin"):
        (source / name).write_bytes(os.urandom(16 << 20))
    mapping = {"sourcePath": str(source), "targetPath": f"{WS}/src", "kind": "directory"}
    core = rig.emulator.core
    assert core is not None
    # The emulator takes the upload and sits on it: the archive's PUT stays in flight.
    await rig.emulator.admin.add_fault("PUT", r"^/v1/sandboxes/[^/]+/files$", delay_ms=120_000)
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            rig.in_background, "sync", "environmentSyncIn", sync_params(rig, lease, files=[mapping])
        )
        with anyio.fail_after(60):
            while core.faults:  # taken when the PUT arrives
                assert "sync" not in rig.outcomes, rig.outcomes
                await anyio.sleep(0.01)
        [workdir] = temp_leftovers(rig.tmpdir)
        assert (workdir / "data").stat().st_size > 32 << 20  # the archive being uploaded
        events_before = len(rig.peer.events)
        await rig.kill_worker_and_wait("worker")
    assert_worker_lost(rig.outcomes["sync"])
    await rig.restart_automatically(events_before)
    assert temp_leftovers(rig.tmpdir) == [workdir]

    probe = await rig.call("environmentProbe", rig.common())  # any call with the config will do
    assert probe["ok"] is True, probe
    assert temp_leftovers(rig.tmpdir) == []
    assert rig.journal_rows("tempdirs") == 0
    assert await rig.live_trees() == []
    await rig.release(lease)


async def kill_during_sync_in(
    rig: Rig, params: dict[str, Any], ready: Callable[[], Awaitable[bool]]
) -> None:
    """Start a sync in, SIGKILL the worker once ``ready()``, wait for the manager's restart."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.in_background, "sync", "environmentSyncIn", params)
        with anyio.fail_after(60):
            while not await ready():
                assert "sync" not in rig.outcomes, rig.outcomes
                await anyio.sleep(0.02)
        events_before = len(rig.peer.events)
        await rig.kill_worker_and_wait("worker")
    assert_worker_lost(rig.outcomes["sync"])
    await rig.restart_automatically(events_before)


async def sandbox_stdout(rig: Rig, sandbox_id: str, argv: list[str]) -> str:
    """The stdout of a buffered exec of ``argv``, straight to the emulator (a call through the
    worker would run recovery first); it carries no command token."""
    pacer = RequestPacer(rig.emulator.base_url, interval=0)
    async with CreateOSClient(rig.emulator.base_url, "test-key", pacer=pacer) as client:
        return (await client.exec(sandbox_id, argv[0], argv[1:])).stdout


async def sandbox_scratches(rig: Rig, sandbox_id: str) -> list[str]:
    """The sync scratch files in the sandbox's /tmp."""
    listed = await sandbox_stdout(rig, sandbox_id, ["/bin/ls", "-A", "/tmp"])
    return [n for n in listed.split() if n.startswith("paperclip-createos-transfer-")]


async def token_carriers(rig: Rig, sandbox_id: str) -> list[str]:
    """``"<pid> <cmdline>"`` of every process in the sandbox carrying a command token."""
    return (await sandbox_stdout(rig, sandbox_id, ["/bin/bash", "-c", TREE_SCAN])).splitlines()


async def test_worker_killed_between_upload_and_placement_next_call_removes_the_scratch(
    rig: Rig, tmp_path: Path
) -> None:
    await rig.start(auto_restart=True)
    lease = await rig.acquire()
    sandbox_id = lease["providerLeaseId"]
    source = tmp_path / "file.txt"
    source.write_text("a copy of the host's files\n" * 10_000)  # too large to travel inline
    mapping = {"sourcePath": str(source), "targetPath": f"{WS}/file.txt", "kind": "file"}
    core = rig.emulator.core
    assert core is not None
    # The upload lands; the placement command's exec stream then sits in the emulator.
    await rig.emulator.admin.add_fault("POST", r"^/v1/sandboxes/[^/]+/exec$", delay_ms=120_000)

    async def placing() -> bool:  # the fault is taken when the placement's exec arrives
        return not core.faults

    await kill_during_sync_in(rig, sync_params(rig, lease, files=[mapping]), placing)
    assert len(await sandbox_scratches(rig, sandbox_id)) == 1  # what the crash left behind
    assert rig.journal_rows("scratches") == 1
    [journaled] = rig.journaled_commands()  # the placement, sent but not answered
    assert journaled.startswith("cmd:")

    probe = await rig.call("environmentProbe", rig.common())  # any call with the config will do
    assert probe["ok"] is True, probe
    assert await sandbox_scratches(rig, sandbox_id) == []
    assert rig.journal_rows("scratches") == 0
    assert rig.journal_rows("processes") == 0  # killed by its token (a tombstone: it never runs)
    await rig.release(lease)


async def test_worker_killed_during_a_post_upload_command_next_call_kills_it(
    rig: Rig, tmp_path: Path
) -> None:
    await rig.start(auto_restart=True)
    lease = await rig.acquire()
    sandbox_id = lease["providerLeaseId"]
    baseline = await sandbox_pids(rig, sandbox_id)
    source = tmp_path / "file.txt"
    source.write_text("payload\n")
    mapping = {"sourcePath": str(source), "targetPath": f"{WS}/file.txt", "kind": "file"}
    command = {"command": "(sleep 300 &); (sleep 301 &); sleep 302", "timeoutMs": 600_000}
    params = sync_params(rig, lease, files=[mapping], postUploadCommands=[command])

    async def running() -> bool:  # the sleepers run: the placement step is over
        return any(runs(line, "sleep 302") for line in await token_carriers(rig, sandbox_id))

    await kill_during_sync_in(rig, params, running)
    # The host-authored command outlived the worker.
    assert_sleepers(await token_carriers(rig, sandbox_id), "sleep 300", "sleep 301", "sleep 302")

    after = await rig.execute(lease, f"cat {WS}/file.txt")
    assert (after["exitCode"], after["stdout"]) == (0, "payload\n")
    assert await token_carriers(rig, sandbox_id) == []
    assert await rig.live_trees() == []
    assert await sandbox_pids(rig, lease["providerLeaseId"]) == baseline
    assert rig.journal_rows("processes") == 0
    assert temp_leftovers(rig.tmpdir) == []
    await rig.release(lease)


async def test_worker_killed_during_acquire_next_call_deletes_the_sandbox(rig: Rig) -> None:
    await rig.start(auto_restart=True)
    core = rig.emulator.core
    assert core is not None
    # The create request arrives, the worker dies waiting, then the sandbox gets made anyway:
    # a billable sandbox nobody holds a lease for, known only by the journaled name token.
    await rig.emulator.admin.add_fault("POST", r"^/v1/sandboxes$", delay_ms=1500)
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            rig.in_background, "acquire", "environmentAcquireLease", {**rig.common(), "runId": "r"}
        )
        with anyio.fail_after(60):
            while core.faults:
                await anyio.sleep(0.01)
        assert rig.journal_rows("creates") == 1
        events_before = len(rig.peer.events)
        await rig.kill_worker_and_wait("worker")
    assert_worker_lost(rig.outcomes["acquire"])
    with anyio.fail_after(30):
        while not (await rig.emulator.admin.state())["sandboxes"]:
            await anyio.sleep(0.05)
    [orphan] = (await rig.emulator.admin.state())["sandboxes"]
    assert orphan["name"].startswith("pc-")
    await rig.restart_automatically(events_before)

    probe = await rig.call("environmentProbe", rig.common())  # any call with the config
    assert probe["ok"] is True, probe
    live = [s["id"] for s in (await rig.emulator.admin.state())["sandboxes"]]
    assert orphan["id"] not in live or await sandbox_status(rig, orphan["id"]) == "destroyed"
    assert rig.journal_rows("creates") == 0


async def sandbox_status(rig: Rig, sandbox_id: str) -> str | None:
    for sandbox in (await rig.emulator.admin.state())["sandboxes"]:
        if sandbox["id"] == sandbox_id:
            return str(sandbox["status"])
    return None
