"""Driver flows through the REAL Paperclip worker manager (@paperclipai/server 2026.916.1).

The worker runs in its own process under the manager (``HostPeer``) and reaches the in-process
emulator over loopback. The worker paces its requests with the real 300 ms (the host scrubs
``PAPERCLIP_CREATEOS_PACE_MS`` from its environment), so each test keeps its request count low.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from devtools.call_params import environment_call, lease_ref, with_lease
from devtools.host_peer import HostPeer
from devtools.peer_sessions import PeerCallError
from provider.emulator import Emulator
from tests.driver.stream_helpers import carriers_at
from tests.host.peer_helpers import CALL_TIMEOUT_MS, DROPPED_LOG, LogSink

pytestmark = [pytest.mark.anyio, pytest.mark.host]


@dataclass
class Flow:
    """The manager with a started worker, the emulator it talks to, and call helpers."""

    peer: HostPeer
    emulator: Emulator
    log_file: Path
    company_id: str = "company-host"
    environment_id: str = "env-host"

    def common(self, *, reuse: bool) -> dict[str, Any]:
        return environment_call(
            self.emulator.base_url,
            "test-key",
            company_id=self.company_id,
            environment_id=self.environment_id,
            timeout_ms=60_000,
            reuseLease=reuse,
            autoPauseAfterSeconds=0,  # window 0: a kept lease is paused at release
        )

    async def call(self, method: str, params: dict[str, Any], **extra: Any) -> Any:
        return await self.peer.call(method, params, timeout_ms=CALL_TIMEOUT_MS, **extra)

    async def acquire(self, *, reuse: bool) -> dict[str, Any]:
        # A heartbeat run of an execution workspace: with reuse on, its lease is kept.
        run = {"runId": "run-host", "agentId": "agent-host", "executionWorkspaceId": "ws-host"}
        lease: dict[str, Any] = await self.call(
            "environmentAcquireLease", {**self.common(reuse=reuse), **run}
        )
        return lease

    def lease_ref(self, lease: dict[str, Any], *, reuse: bool) -> dict[str, Any]:
        return lease_ref(self.common(reuse=reuse), lease)

    def with_lease(self, lease: dict[str, Any], *, reuse: bool) -> dict[str, Any]:
        return with_lease(self.common(reuse=reuse), lease)

    async def sandbox_status(self, sandbox_id: str) -> str | None:
        for sandbox in (await self.emulator.admin.state())["sandboxes"]:
            if sandbox["id"] == sandbox_id:
                return str(sandbox["status"])
        return None

    def peer_log(self) -> str:
        return self.log_file.read_text(errors="replace")


@pytest.fixture
async def flow(emulator: Emulator, tmp_path: Path) -> AsyncIterator[Flow]:
    log_file = tmp_path / "peer.log"
    async with HostPeer(log_file=log_file, cwd=tmp_path) as peer:
        await peer.start_worker(auto_restart=False)
        yield Flow(peer, emulator, log_file)
        await peer.stop_worker()


async def test_lease_lifecycle_through_the_worker_manager(flow: Flow) -> None:
    # Without reuse: acquire, realize, release deletes the sandbox.
    lease = await flow.acquire(reuse=False)
    sandbox_id = lease["providerLeaseId"]
    assert lease["metadata"]["provider"] == "createos"
    assert lease["metadata"]["companyId"] == flow.company_id
    assert "test-key" not in repr(lease)
    assert await flow.sandbox_status(sandbox_id) == "running"
    realized = await flow.call(
        "environmentRealizeWorkspace",
        {**flow.with_lease(lease, reuse=False), "workspace": {"localPath": "/host/ws"}},
    )
    assert realized["cwd"] == "/paperclip-workspace"
    receipt = await flow.call("environmentReleaseLease", flow.lease_ref(lease, reuse=False))
    assert receipt == {"providerLeaseId": sandbox_id, "state": "destroyed"}
    assert await flow.sandbox_status(sandbox_id) in ("destroyed", "destroying", None)

    # With reuse: release pauses, resume hands back the same sandbox, destroy deletes it.
    reusable = await flow.acquire(reuse=True)
    reusable_id = reusable["providerLeaseId"]
    assert reusable_id != sandbox_id
    assert reusable["metadata"]["reuseLease"] is True
    receipt = await flow.call("environmentReleaseLease", flow.lease_ref(reusable, reuse=True))
    assert receipt == {"providerLeaseId": reusable_id, "state": "stopped"}
    assert await flow.sandbox_status(reusable_id) == "paused"
    resumed = await flow.call("environmentResumeLease", flow.lease_ref(reusable, reuse=True))
    assert resumed["providerLeaseId"] == reusable_id
    assert resumed["metadata"]["marker"] == reusable["metadata"]["marker"]
    assert await flow.sandbox_status(reusable_id) == "running"
    receipt = await flow.call("environmentDestroyLease", flow.lease_ref(reusable, reuse=True))
    assert receipt == {"providerLeaseId": reusable_id, "state": "destroyed"}
    assert await flow.sandbox_status(reusable_id) in ("destroyed", "destroying", None)


async def test_execute_streams_ordered_chunks_to_each_calls_own_sink(flow: Flow) -> None:
    lease = await flow.acquire(reuse=False)
    interleaved = (
        "echo out-1; sleep 0.3; echo err-1 >&2; sleep 0.3; echo out-2; sleep 0.3; "
        "echo err-2 >&2; sleep 0.3; printf 'caf\\xc3'; sleep 0.3; printf '\\xa9\\n'; exit 3"
    )
    other = "for i in 1 2 3; do echo other-$i; sleep 0.4; done"
    first, second = LogSink(), LogSink()
    results: dict[str, Any] = {}

    async def execute(name: str, script: str, sink: LogSink) -> None:
        params = {**flow.with_lease(lease, reuse=False), "command": "bash", "args": ["-c", script]}
        results[name] = await flow.call("environmentExecute", params, on_log=sink)

    # Two executes of the same company overlap: the manager routes each execute.log by the
    # invocation id the worker echoes, so each sink sees only its own command's output.
    async with anyio.create_task_group() as tg:
        tg.start_soon(execute, "first", interleaved, first)
        tg.start_soon(execute, "second", other, second)

    assert first.chunks == [
        ("stdout", "out-1\n"),
        ("stderr", "err-1\n"),
        ("stdout", "out-2\n"),
        ("stderr", "err-2\n"),
        ("stdout", "caf"),
        ("stdout", "é\n"),  # the split character came out whole, in the second chunk
    ]
    result = results["first"]
    assert result["exitCode"] == 3 and result["timedOut"] is False
    assert result["stdout"] == first.text("stdout") == "out-1\nout-2\ncafé\n"
    assert result["stderr"] == first.text("stderr") == "err-1\nerr-2\n"
    assert result["metadata"]["outputTruncated"] is False
    assert result["metadata"] == {"outputTruncated": False}  # one exec: no process id

    assert second.chunks == [("stdout", f"other-{i}\n") for i in (1, 2, 3)]
    assert results["second"]["stdout"] == "other-1\nother-2\nother-3\n"
    assert results["second"]["exitCode"] == 0
    assert DROPPED_LOG not in flow.peer_log()  # nothing was routed by guesswork or lost

    receipt = await flow.call("environmentReleaseLease", flow.lease_ref(lease, reuse=False))
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}


async def test_release_during_a_streaming_execute_cancels_it_and_kills_the_tree(
    flow: Flow,
) -> None:
    lease = await flow.acquire(reuse=True)
    sandbox_id = lease["providerLeaseId"]
    sink = LogSink()
    outcome: list[BaseException | dict[str, Any]] = []
    # A background child that outlives its parent, plus a steady trickle of output.
    script = "(sleep 300 &); setsid sleep 301 & while true; do echo tick; sleep 0.2; done"

    async def long_execute() -> None:
        params = {**flow.with_lease(lease, reuse=True), "command": "bash", "args": ["-c", script]}
        try:
            outcome.append(await flow.call("environmentExecute", params, on_log=sink))
        except PeerCallError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(long_execute)
        with anyio.fail_after(60):
            while len(sink.chunks) < 3:  # streaming for a while
                await anyio.sleep(0.05)
        assert len(await carriers_at(flow.emulator.base_url, sandbox_id)) >= 4
        # Served while the execute is still open: the worker handles requests concurrently.
        receipt = await flow.call("environmentReleaseLease", flow.lease_ref(lease, reuse=True))
        assert receipt == {"providerLeaseId": sandbox_id, "state": "stopped"}

    assert len(outcome) == 1
    error = outcome[0]
    assert isinstance(error, PeerCallError), error
    assert "cancelled" in error.message
    assert set(sink.chunks) == {("stdout", "tick\n")}
    assert await flow.sandbox_status(sandbox_id) == "paused"
    async with httpx.AsyncClient(base_url=flow.emulator.base_url) as http:  # look inside
        resumed = await http.post(
            f"/v1/sandboxes/{sandbox_id}/resume", headers={"X-Api-Key": "test-key"}
        )
        assert resumed.status_code < 300, resumed.text
    with anyio.fail_after(20):
        while await flow.sandbox_status(sandbox_id) != "running":
            await anyio.sleep(0.05)
    assert await carriers_at(flow.emulator.base_url, sandbox_id) == []  # the whole tree is gone

    receipt = await flow.call("environmentDestroyLease", flow.lease_ref(lease, reuse=True))
    assert receipt == {"providerLeaseId": sandbox_id, "state": "destroyed"}
