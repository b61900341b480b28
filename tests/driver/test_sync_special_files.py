"""Host special files in a sync (issue 21, items 3 and 9), on the emulator: a FIFO, a socket or
a ``/proc`` file never blocks the worker, never arrives silently empty, and is never silently
dropped; a FIFO in a sync-out target is replaced, never opened."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from provider.errors import TransferError
from tests.driver.conftest import Harness
from tests.driver.sync_helpers import WS, mapping, op, sh, sync_in, sync_out
from tests.processes import reap

pytestmark = pytest.mark.anyio

DEADLINE_S = 20.0  # generous: the call must end well before it, not at it
REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_a_fifo_file_source_is_refused_at_once_and_the_lease_stays_usable(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    before = len(await h.emulator.admin.requests())
    with anyio.fail_after(DEADLINE_S), pytest.raises(TransferError) as caught:
        await sync_in(h, lease, op(mapping(fifo, f"{WS}/pipe")))
    assert str(caught.value) == (
        f"Reading {fifo} failed on the host: it is a FIFO, not a regular file; "
        "a kind: file mapping syncs regular files only."
    )
    assert len(await h.emulator.admin.requests()) == before  # refused before any request
    assert (await sh(h, lease, "echo alive"))["stdout"] == "alive\n"
    with anyio.fail_after(DEADLINE_S):
        assert await h.methods.destroy(h.lease_ref(lease)) is not None


async def test_a_proc_file_whose_size_reads_zero_is_refused(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    with pytest.raises(TransferError, match=r"its size reads 0 but it has content"):
        await sync_in(h, lease, op(mapping("/proc/self/status", f"{WS}/status")))
    listed = await sh(h, lease, f"ls {WS}/status 2>&1; ls -A /tmp | grep -c paperclip || true")
    assert "No such file" in listed["stdout"] and listed["stdout"].endswith("0\n")


async def test_special_files_left_out_of_a_directory_are_reported_and_logged(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "keep").write_text("kept")
    os.mkfifo(source / "sub" / "pipe")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(source / "sock"))
        result = await sync_in(h, lease, op(mapping(source, f"{WS}/dst", "directory")))
    assert result["operations"] == [
        {
            "operationId": "op-1",
            "filesTransferred": 1,
            "bytesTransferred": result["operations"][0]["bytesTransferred"],
            "skippedSpecialFiles": 2,
            "skippedPaths": [str(source / "sock"), str(source / "sub" / "pipe")],
        }
    ]
    assert ("warn", f"Sync in of {source}: 2 special file(s) (FIFO, socket or device) left "
            "out, not transferred: sock, sub/pipe") in h.logs  # fmt: skip
    listed = await sh(h, lease, f"cd {WS}/dst && find . | sort")
    assert listed["stdout"].split() == [".", "./keep", "./sub"]


async def test_a_fifo_in_a_sync_out_target_is_replaced_never_opened(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    lease = await h.acquire()
    await sh(h, lease, f"mkdir -p {WS}/out && echo tree > {WS}/out/f && echo one > {WS}/one")
    target = tmp_path / "target"
    target.mkdir()
    os.mkfifo(target / "f")
    os.mkfifo(tmp_path / "single")
    with anyio.fail_after(DEADLINE_S):
        await sync_out(
            h,
            lease,
            op(
                mapping(f"{WS}/out", target, "directory"), mapping(f"{WS}/one", tmp_path / "single")
            ),
        )
    assert (target / "f").read_text() == "tree\n"  # a regular file now: reading never blocks
    assert (tmp_path / "single").read_text() == "one\n"


def _message(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert proc.stdout is not None
    while True:  # skip notifications (log lines) until the reply
        message: dict[str, Any] = json.loads(proc.stdout.readline())
        if "id" in message:
            return message


def _call(proc: subprocess.Popen[bytes], ident: int, method: str, params: Any) -> Any:
    assert proc.stdin is not None
    line = {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}
    proc.stdin.write(json.dumps(line).encode() + b"\n")
    proc.stdin.flush()
    return _message(proc)


def _fifo_then_shutdown(h: Harness, tmp_path: Path) -> list[Any]:
    """In a real worker process: acquire, sync in a FIFO, destroy, shutdown; the replies."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "provider"],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        replies = [_call(proc, 1, "initialize", {})]
        lease = _call(proc, 2, "environmentAcquireLease", h.acquire_params())["result"]
        params = {**h.with_lease(lease), "operations": [op(mapping(fifo, f"{WS}/pipe"))]}
        replies.append(_call(proc, 3, "environmentSyncIn", params))
        replies.append(_call(proc, 4, "environmentDestroyLease", h.lease_ref(lease)))
        replies.append(_call(proc, 5, "shutdown", {}))
        replies.append(proc.wait(timeout=DEADLINE_S))
        return replies
    finally:
        reap(proc)


async def test_a_worker_given_a_fifo_still_destroys_and_shuts_down(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    with anyio.fail_after(DEADLINE_S * 3):
        _, synced, destroyed, shutdown, code = await anyio.to_thread.run_sync(
            _fifo_then_shutdown, h, tmp_path
        )
    assert "a FIFO, not a regular file" in synced["error"]["message"]
    assert destroyed["result"]["state"] == "destroyed"
    assert shutdown == {"jsonrpc": "2.0", "id": 5, "result": None}
    assert code == 0
    sandboxes = (await h.emulator.admin.state())["sandboxes"]
    assert [s["status"] for s in sandboxes if s["status"] != "deleted"] == []
