"""The peer's own relay: ``host/peer-driver.mjs`` stdout under backpressure, read by ``HostPeer``.

The driver batches its NDJSON lines and waits for 'drain' while the pipe is full; these tests make
the reader fall behind and check that every line still arrives whole, in order, and before exit.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import anyio
import pytest

from devtools.call_params import common_params
from devtools.host_peer import DRIVER_SCRIPT, HostPeer, ensure_peer_installed
from tests.host.peer_helpers import streaming_package

pytestmark = [pytest.mark.anyio, pytest.mark.host]


async def test_a_slow_log_sink_still_gets_every_chunk_whole_and_in_order(tmp_path: Path) -> None:
    chunks = [f"{index:05d} é✓ {'x' * 18_000}\n" for index in range(400)]  # ~7 MiB of lines
    live: list[tuple[str, str]] = []

    def sink(stream: str, chunk: str) -> None:
        if len(live) in (0, 150):
            time.sleep(0.3)  # the reader stalls: the driver's pipe fills and it must wait
        live.append((stream, chunk))

    async with HostPeer(log_file=tmp_path / "peer.log", cwd=tmp_path) as peer:
        await peer.start_worker(package_root=streaming_package(tmp_path))
        params = {
            **common_params({}, company_id="company-1", environment_id="env-1"),
            "lease": {"providerLeaseId": "sb_1", "metadata": {}},
            "command": "echo",
            "chunks": chunks,
        }
        result = await peer.call("environmentExecute", params, timeout_ms=120_000, on_log=sink)
        assert await peer.status()  # the driver still answers after the burst
        await peer.stop_worker()
    assert live == [("stdout", chunk) for chunk in chunks] + [("stderr", "warn\n")]
    assert result["stdout"] == "".join(chunks)


async def test_the_driver_flushes_every_answer_before_it_exits(tmp_path: Path) -> None:
    peer_dir = await ensure_peer_installed()
    count = 20_000  # answers well beyond a pipe's capacity, queued while nobody reads
    commands = "".join(json.dumps({"id": i, "op": "status"}) + "\n" for i in range(1, count + 1))
    process = await anyio.open_process(
        [
            "node",
            str(DRIVER_SCRIPT),
            "--peer-dir",
            str(peer_dir),
            "--log-file",
            str(tmp_path / "l"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    async with process:
        assert process.stdin is not None and process.stdout is not None
        await process.stdin.send(commands.encode())
        await process.stdin.aclose()  # the driver answers everything, then exits
        # The test: a host that does not read for a second while the driver answers and
        # exits (its pipe fills; the driver shows nothing to wait on)
        await anyio.sleep(1.0)
        received = bytearray()
        with anyio.fail_after(60):
            async for data in process.stdout:
                received += data
            assert await process.wait() == 0
    messages = [json.loads(line) for line in received.decode().splitlines()]
    assert messages[0]["event"] == "ready"
    answers = messages[1:]
    assert [m["id"] for m in answers] == list(range(1, count + 1))
    assert all(m["ok"] for m in answers)
