"""Live smoke: reusable CreateOS sandboxes through the worker, end to end.

Runs against a real account with ``CREATEOS_LIVE_TEST=1`` and against the embedded emulator with
``CREATEOS_LIVE_TEST=emulator``; skipped otherwise. Each sandbox is destroyed in ``finally`` and
a failed destroy fails the test.

Covered: config validation, the probe, a 5 MiB round trip (sync in, execute, sync out), the
egress allowlist of ``CREATEOS_EGRESS_ALLOWLIST`` on the sandbox, a warm release resumed to the
same sandbox (on the emulator its idle timer is fired in between; a real account's sandbox is
still running, which resume takes too) and a sync in overlapping a sync out on one lease.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import anyio
import pytest

from devtools.demo_egress import GREETING, connect_script, loopback_listener
from live_tests.session import LiveSession
from provider.driver.leases.placement import merge_egress

pytestmark = pytest.mark.anyio

ROOT = "/paperclip-workspace"
BLOB_SIZE = 5 * 1024 * 1024
SANDBOX_DIR = f"{ROOT}/live-smoke"
WARM_WINDOW_S = 600  # autoPauseAfterSeconds by default
HELD_UPLOAD_MS = 3000  # on the emulator, how long the overlapping sync in's upload is held


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_config_validates_without_touching_the_network(live: LiveSession) -> None:
    answer = await live.validate()
    assert answer["ok"] is True, answer.get("errors")
    normalized = answer["normalizedConfig"]
    assert normalized["reuseLease"] is True
    assert normalized["timeoutMs"] == 300_000
    assert normalized["apiUrl"].startswith(("https://", "http://"))
    assert not normalized["apiUrl"].endswith("/")
    assert normalized["egressAllowlist"] == live.config.get("egressAllowlist", [])
    assert normalized["autoPauseAfterSeconds"] == WARM_WINDOW_S


async def test_probe_creates_a_sandbox_runs_a_command_and_deletes_it(live: LiveSession) -> None:
    answer = await live.call("environmentProbe", live.common())
    assert answer["ok"] is True, answer.get("summary")
    if live.emulator is not None:
        live_sandboxes = [
            s
            for s in (await live.emulator.admin.state())["sandboxes"]
            if s["status"] not in ("destroyed", "destroying")
        ]
        assert live_sandboxes == []


async def test_reusable_lease_round_trip(live: LiveSession, tmp_path: Path) -> None:
    blob = tmp_path / "blob.bin"
    data = os.urandom(BLOB_SIZE - 7) + b"\x00\xff\x80\n\r\x00\x01"  # binary, with the odd bytes
    await anyio.to_thread.run_sync(blob.write_bytes, data)
    blob.chmod(0o640)
    expected_sha = hashlib.sha256(data).hexdigest()

    async with live.reusable_lease() as lease:
        sandbox_id = lease["providerLeaseId"]
        assert sandbox_id
        assert lease["metadata"]["reuseLease"] is True
        assert lease["metadata"]["remoteCwd"] == ROOT

        # 5 MiB in through native sync: byte-exact, host mode kept.
        synced = await live.sync(
            "in",
            lease,
            {"sourcePath": str(blob), "targetPath": f"{SANDBOX_DIR}/blob.bin", "kind": "file"},
        )
        assert synced["operations"] == [
            {"operationId": "live-in", "filesTransferred": 1, "bytesTransferred": BLOB_SIZE}
        ]
        check = await live.execute(
            lease, "sha256sum blob.bin; stat -c %a blob.bin", cwd=SANDBOX_DIR
        )
        assert check.result["exitCode"] == 0, check.result["stderr"]
        assert check.result["stdout"] == f"{expected_sha}  blob.bin\n640\n"

        # ... and back out to a fresh host path: identical bytes, mode 0600.
        back = tmp_path / "out" / "blob.bin"
        synced = await live.sync(
            "out",
            lease,
            {"sourcePath": f"{SANDBOX_DIR}/blob.bin", "targetPath": str(back), "kind": "file"},
        )
        assert synced["operations"][0]["bytesTransferred"] == BLOB_SIZE
        assert await anyio.to_thread.run_sync(sha256_of, back) == expected_sha
        assert back.stat().st_mode & 0o777 == 0o600

        # stdin, env and stderr, with live output on both streams.
        tricky = 'it\'s $HOME; `not run` "quoted"'
        outcome = await live.execute(
            lease,
            'read -r line; echo "stdin=$line"; echo "env=$LIVE_VAR"; echo "to-stderr" >&2; exit 3',
            stdin="hello from stdin\nsecond line\n",
            env={"LIVE_VAR": tricky},
        )
        result = outcome.result
        assert result["exitCode"] == 3 and result["timedOut"] is False
        assert result["stdout"] == f"stdin=hello from stdin\nenv={tricky}\n"
        assert result["stderr"] == "to-stderr\n"
        assert outcome.live_text("stdout") == result["stdout"]
        assert outcome.live_text("stderr") == result["stderr"]

    if live.emulator is not None:  # destroyed on the way out
        assert await live.sandbox_status(sandbox_id) in ("destroyed", "gone")


async def test_the_egress_allowlist_is_the_sandboxs(live: LiveSession) -> None:
    base = live.config.get("egressAllowlist", [])
    effective = list(merge_egress(base, ()))  # no run grants: "*" dropped beside other rules
    async with live.reusable_lease() as lease:
        sandbox_id = lease["providerLeaseId"]
        assert lease["metadata"]["baseEgressAllowlist"] == base
        assert lease["metadata"]["effectiveEgressAllowlist"] == effective
        view = await live.sandbox_view(sandbox_id)
        if view is None:
            return  # a real account: its enforcement is not visible from here
        # The emulator: a restrictive list is loopback only; allow-all is user-mode (slirp4netns;
        # the host's network where it is missing).
        if effective:
            assert view["network"] == "loopback-only"
        else:
            assert view["network"] in ("user-mode", "host")
        async with loopback_listener() as listener:
            outcome = await live.execute(lease, connect_script(listener.port))
        result = outcome.result
        if effective:
            assert result["exitCode"] != 0, result
            assert "Connection refused" in result["stderr"], result
            assert listener.connections == 0
        else:
            assert result["exitCode"] == 0, result["stderr"]
            assert result["stdout"] == f"connected: {GREETING}\n"
            assert listener.connections == 1


async def test_a_warm_release_resumes_the_same_sandbox_with_its_files(live: LiveSession) -> None:
    mark = f"survivor-{uuid.uuid4()}"
    async with live.reusable_lease() as lease:
        sandbox_id = lease["providerLeaseId"]
        metadata = lease["metadata"]
        assert metadata["reuseLease"] is True
        assert metadata["autoPauseAfterSeconds"] == WARM_WINDOW_S
        wrote = await live.execute(
            lease,
            f'mkdir -p {SANDBOX_DIR} && printf %s "$MARK" > {SANDBOX_DIR}/survivor.txt',
            env={"MARK": mark},
        )
        assert wrote.result["exitCode"] == 0, wrote.result["stderr"]

        # Warm: the run's processes are stopped, the sandbox is left running (not paused).
        receipt = await live.release(lease)
        assert receipt == {"providerLeaseId": sandbox_id, "state": "stopped"}
        if live.emulator is not None:
            assert await live.sandbox_status(sandbox_id) == "running"
            assert await live.tree_alive_processes(sandbox_id) == []
            # CreateOS pauses it once idle for the window: fire that timer now.
            await live.emulator.admin.idle_pause(sandbox_id)
            await live.wait_for_status(sandbox_id, "paused")

        resumed = await live.resume(lease)
        assert resumed["providerLeaseId"] == sandbox_id
        assert resumed["metadata"]["resumedLease"] is True
        assert resumed["metadata"]["marker"] == metadata["marker"]
        lease.clear()
        lease.update(resumed)
        if live.emulator is not None:
            assert await live.sandbox_status(sandbox_id) == "running"

        again = await live.execute(lease, "cat survivor.txt", cwd=SANDBOX_DIR)
        assert again.result["exitCode"] == 0, again.result["stderr"]
        assert again.result["stdout"] == mark

    # Destroyed on the way out: the sandbox is gone for good.
    gone = await live.resume({"providerLeaseId": sandbox_id, "metadata": resumed["metadata"]})
    assert gone == {"providerLeaseId": None, "metadata": {"expired": True}}
    if live.emulator is not None:
        assert await live.sandbox_status(sandbox_id) in ("destroyed", "gone")


async def test_a_sync_in_and_a_sync_out_overlap_on_one_lease(
    live: LiveSession, tmp_path: Path
) -> None:
    inbound = tmp_path / "inbound.bin"
    data = os.urandom(2 * 1024 * 1024 + 3)
    await anyio.to_thread.run_sync(inbound.write_bytes, data)
    back = tmp_path / "out" / "outbound.bin"
    async with live.reusable_lease() as lease:
        made = await live.execute(
            lease,
            f"mkdir -p {SANDBOX_DIR} && head -c 1048579 /dev/urandom > {SANDBOX_DIR}/outbound.bin"
            f" && sha256sum < {SANDBOX_DIR}/outbound.bin",
        )
        assert made.result["exitCode"] == 0, made.result["stderr"]
        outbound_sha = made.result["stdout"].split()[0]
        if live.emulator is not None:
            # Hold the sync in's upload (the only PUT of a file): the sync out, started after
            # it, can only finish first if the two run at once.
            await live.emulator.admin.add_fault("PUT", r"/files$", delay_ms=HELD_UPLOAD_MS)
        results: dict[str, dict[str, object]] = {}
        finished: list[str] = []

        async def sync(direction: str, mapping: dict[str, str]) -> None:
            results[direction] = await live.sync(direction, lease, mapping)
            finished.append(direction)

        async with anyio.create_task_group() as group:
            group.start_soon(
                sync,
                "in",
                {
                    "sourcePath": str(inbound),
                    "targetPath": f"{SANDBOX_DIR}/inbound.bin",
                    "kind": "file",
                },
            )
            await anyio.sleep(0.2)
            group.start_soon(
                sync,
                "out",
                {
                    "sourcePath": f"{SANDBOX_DIR}/outbound.bin",
                    "targetPath": str(back),
                    "kind": "file",
                },
            )
        assert results["in"]["operations"] == [
            {"operationId": "live-in", "filesTransferred": 1, "bytesTransferred": len(data)}
        ]
        assert results["out"]["operations"] == [
            {"operationId": "live-out", "filesTransferred": 1, "bytesTransferred": 1048579}
        ]
        if live.emulator is not None:
            assert finished == ["out", "in"], "the sync out waited for the sync in"
        assert await anyio.to_thread.run_sync(sha256_of, back) == outbound_sha
        check = await live.execute(lease, "sha256sum < inbound.bin", cwd=SANDBOX_DIR)
        assert check.result["exitCode"] == 0, check.result["stderr"]
        assert check.result["stdout"].split()[0] == hashlib.sha256(data).hexdigest()
