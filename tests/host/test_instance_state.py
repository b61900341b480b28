"""Two Paperclip instances of one Unix account, through the REAL worker manager (2026.916.1).

Each instance's manager starts the worker with its own ``PAPERCLIP_PLUGIN_ID`` (the plugin's
record in that instance's database); here the two workers also differ in ``TMPDIR`` and
``XDG_RUNTIME_DIR``. They share ``XDG_STATE_HOME``, the stand-in for the account's state root
(the account's home under a real host). What each worker process holds open says which files
it uses: its own journal, the legacy journal of the earlier version, and the same pacing file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from devtools.call_params import environment_call
from devtools.host_peer import HostPeer
from devtools.peer_sessions import PeerCallError
from provider.createos.client import CreateOSClient
from provider.driver.core.journal import LeaseJournal
from provider.emulator import Emulator
from tests.host.peer_helpers import CALL_TIMEOUT_MS

pytestmark = [pytest.mark.anyio, pytest.mark.host]

INSTANCES = ("6f1c2a43-8d0e-4a55-9d0b-2f5e8c4b7a10", "0b9e7d21-3c4f-4e8a-b1d2-7a6c5e4f3d21")
KEYS = dict(zip(INSTANCES, ("test-key", "other-key"), strict=True))
DEAD_OWNER = "4194304:0"  # above the kernel's pid limit: never alive


def open_files(pid: int) -> set[Path]:
    found: set[Path] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed while we looked
            found.add(Path(os.readlink(fd)))
    return found


def legacy_rows(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT count(*) FROM creates").fetchone()[0])


async def test_two_instances_keep_apart_share_pacing_and_drain_the_legacy_journal(
    emulator: Emulator, tmp_path: Path
) -> None:
    root = tmp_path / "state" / "paperclip-createos"
    # Left by a worker of the earlier version that died mid-acquire: the sandbox is billable.
    async with CreateOSClient(emulator.base_url, "test-key") as client:
        legacy_id = await client.create_sandbox(
            shape="s-1vcpu-1gb", name="pc-legacy", rootfs=None, region=None
        )
    old = LeaseJournal(root / "leases.sqlite3")
    old.owner = DEAD_OWNER
    old.add_create(emulator.base_url, hashlib.sha256(b"test-key").hexdigest(), "pc-legacy")
    old.close()

    async with HostPeer(log_file=tmp_path / "peer.log", cwd=tmp_path) as peer:
        leases: dict[str, dict[str, Any]] = {}
        try:
            for n, plugin_id in enumerate(INSTANCES):
                env = {
                    "XDG_STATE_HOME": str(tmp_path / "state"),
                    "TMPDIR": str(tmp_path / f"tmp-{n}"),
                    "XDG_RUNTIME_DIR": str(tmp_path / f"run-{n}"),
                }
                await peer.start_worker(plugin_id, env=env, auto_restart=False)
            # The second instance calls first, with another key: it opens its journal while the
            # legacy entry is there and leaves it alone; the first instance's call cleans it up.
            for plugin_id in INSTANCES[::-1]:
                params = {**environment_call(emulator.base_url, KEYS[plugin_id]), "runId": "r"}
                leases[plugin_id] = await peer.call(
                    "environmentAcquireLease",
                    params,
                    plugin_id=plugin_id,
                    timeout_ms=CALL_TIMEOUT_MS,
                )
            held = {}
            for plugin_id in INSTANCES:
                pid = peer.worker_pid(plugin_id)
                assert pid is not None
                held[plugin_id] = open_files(pid)
        finally:
            for plugin_id, lease in leases.items():
                ref = {
                    **environment_call(emulator.base_url, KEYS[plugin_id]),
                    "providerLeaseId": lease["providerLeaseId"],
                    "leaseMetadata": lease["metadata"],
                }
                await peer.call(
                    "environmentReleaseLease", ref, plugin_id=plugin_id, timeout_ms=CALL_TIMEOUT_MS
                )
            for plugin_id in INSTANCES:
                with contextlib.suppress(PeerCallError):
                    await peer.stop_worker(plugin_id)

    journals = {p: root / "instances" / p / "leases.sqlite3" for p in INSTANCES}
    pace = Path(f"/tmp/paperclip-createos-{os.getuid()}")
    pace /= hashlib.sha256(emulator.base_url.encode()).hexdigest() + ".pace"
    pace.unlink()  # this emulator's port is never used again; the folder is the account's
    for mine, other in (INSTANCES, INSTANCES[::-1]):
        assert journals[mine] in held[mine], sorted(held[mine])
        assert journals[other] not in held[mine]
        assert root / "leases.sqlite3" in held[mine]  # the legacy journal, read by both
        assert pace in held[mine]  # one budget for the IP, whatever TMPDIR and XDG say
    # The first instance's acquire deleted the legacy sandbox, once; the entry is gone for both.
    assert legacy_rows(root / "leases.sqlite3") == 0
    deletes = [r["path"] for r in await emulator.admin.requests() if r["method"] == "DELETE"]
    assert deletes.count(f"/v1/sandboxes/{legacy_id}") == 1
    state = await emulator.admin.state()
    assert [s for s in state["sandboxes"] if s["status"] not in ("destroyed", "destroying")] == []
