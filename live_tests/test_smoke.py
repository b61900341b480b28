"""Live smoke: one reusable CreateOS sandbox through the worker, end to end.

Runs against a real account with ``CREATEOS_LIVE_TEST=1`` and against the embedded emulator with
``CREATEOS_LIVE_TEST=emulator``; skipped otherwise. The sandbox is destroyed in ``finally`` and
a failed destroy fails the test.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import anyio
import pytest

from live_tests.session import LiveSession

pytestmark = pytest.mark.anyio

ROOT = "/paperclip-workspace"
BLOB_SIZE = 5 * 1024 * 1024
SANDBOX_DIR = f"{ROOT}/live-smoke"


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
    mark = f"survivor-{uuid.uuid4()}"

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

        # Write a file, pause, resume the same sandbox, and find the file again.
        wrote = await live.execute(
            lease,
            f'mkdir -p {SANDBOX_DIR} && printf %s "$MARK" > {SANDBOX_DIR}/survivor.txt',
            env={"MARK": mark},
        )
        assert wrote.result["exitCode"] == 0, wrote.result["stderr"]

        receipt = await live.release(lease)
        assert receipt == {"providerLeaseId": sandbox_id, "state": "stopped"}
        if live.emulator is not None:
            assert await live.sandbox_status(sandbox_id) == "paused"

        resumed = await live.resume(lease)
        assert resumed["providerLeaseId"] == sandbox_id
        assert resumed["metadata"]["resumedLease"] is True
        assert resumed["metadata"]["marker"] == lease["metadata"]["marker"]
        lease.clear()
        lease.update(resumed)
        if live.emulator is not None:
            assert await live.sandbox_status(sandbox_id) == "running"

        again = await live.execute(
            lease, "cat survivor.txt; echo; sha256sum blob.bin", cwd=SANDBOX_DIR
        )
        assert again.result["exitCode"] == 0, again.result["stderr"]
        assert again.result["stdout"] == f"{mark}\n{expected_sha}  blob.bin\n"

    # Destroyed on the way out: the sandbox is gone for good.
    gone = await live.resume({"providerLeaseId": sandbox_id, "metadata": resumed["metadata"]})
    assert gone == {"providerLeaseId": None, "metadata": {"expired": True}}
    if live.emulator is not None:
        assert await live.sandbox_status(sandbox_id) in ("destroyed", "gone")
