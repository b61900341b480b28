"""Cleanup never outlives the host's budget (issue 21, item 7): with CreateOS stalled (the
emulator process stopped by SIGSTOP), an execute or a sync that hits its deadline still answers
its specific error before the host gives up on the call (timeout + 30 s, host protocol), and an
execute whose tree kill could not be confirmed leaves the lease poisoned."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from devtools.call_params import call_config, common_params
from devtools.emulator_process import EmulatorProcess
from provider.driver.core.budget import HOST_GRACE
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.runtime import DriverRuntime
from provider.driver.service import DriverService
from provider.emulator import BwrapUnavailable
from provider.emulator.bwrap import probe_runtime
from provider.errors import CleanupUnconfirmed, ProviderError, RequestRefused
from tests.driver.conftest import SHAPE, unpaced_client

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
KEY = "budget-key"


@dataclass
class Stalling:
    emulator: EmulatorProcess
    methods: DriverService
    started: anyio.Event

    def call(self, timeout_ms: int) -> dict[str, Any]:
        config = call_config(
            self.emulator.base_url, KEY, shape=SHAPE, timeout_ms=timeout_ms, autoPauseAfterSeconds=0
        )
        return common_params(config, company_id="c1", environment_id="e1")

    def stall(self) -> None:
        """CreateOS stops answering (connections are still accepted by the kernel)."""
        assert self.emulator.pid is not None
        os.kill(self.emulator.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.emulator.pid is not None
        os.kill(self.emulator.pid, signal.SIGCONT)


@pytest.fixture
async def stalling(tmp_path: Path) -> AsyncIterator[Stalling]:
    try:
        await anyio.to_thread.run_sync(probe_runtime)
    except BwrapUnavailable as exc:
        pytest.skip(str(exc))
    started = anyio.Event()

    async def notify(method: str, params: dict[str, Any]) -> None:
        if method == "execute.log" and "started" in params["chunk"]:
            started.set()

    async def log(*args: Any) -> None:
        return None

    journal = LeaseJournal(tmp_path / "state" / "leases.sqlite3")
    runtime = DriverRuntime(client_factory=unpaced_client, environ={}, journal=journal)
    with tempfile.TemporaryDirectory(prefix="createos-budget-") as top:
        Path(top).chmod(0o755)  # the data dir must be reachable by the guest uid
        async with EmulatorProcess(Path(top) / "emu", KEY) as emulator:
            s = Stalling(emulator, DriverService(runtime, notify=notify, log=log), started)
            async with runtime.background.running():
                try:
                    yield s
                finally:
                    s.resume()


async def timed(call: Any) -> tuple[float, BaseException | None]:
    """Seconds ``call()`` took and what it raised."""
    start = anyio.current_time()
    try:
        await call()
    except ProviderError as exc:
        return anyio.current_time() - start, exc
    return anyio.current_time() - start, None


async def test_an_execute_answers_within_the_host_budget_with_createos_stalled(
    stalling: Stalling,
) -> None:
    s = stalling
    lease = await s.methods.acquire({**s.call(40_000), "runId": "r1"})
    with_lease = {**s.call(40_000), "lease": {**lease, "expiresAt": None}}
    params = {**with_lease, "command": "bash", "args": ["-c", "echo started; sleep 120"]}
    params["timeoutMs"] = 2_000
    budget = params["timeoutMs"] / 1000 + HOST_GRACE  # the host's rule for environmentExecute
    outcome: list[tuple[float, BaseException | None]] = []

    async def execute() -> None:
        outcome.append(await timed(lambda: s.methods.execute(params)))

    async with anyio.create_task_group() as group:
        group.start_soon(execute)
        with anyio.fail_after(30):
            await s.started.wait()
        s.stall()
    elapsed, error = outcome[0]
    assert isinstance(error, CleanupUnconfirmed), error
    assert elapsed < budget
    with pytest.raises(RequestRefused, match="cleanup could not be confirmed"):
        await s.methods.execute({**with_lease, "command": "true"})  # poisoned, no request
    s.resume()
    await s.methods.destroy(
        {
            **s.call(40_000),
            "providerLeaseId": lease["providerLeaseId"],
            "leaseMetadata": lease["metadata"],
        }
    )


@pytest.mark.timeout(240)  # 63 s measured on a loaded 2-core machine
async def test_a_sync_answers_within_the_host_budget_with_createos_stalled(
    stalling: Stalling, tmp_path: Path
) -> None:
    s = stalling
    timeout_ms = 34_000  # over 30 s: two timeouts back to back would pass the host's budget
    lease = await s.methods.acquire({**s.call(timeout_ms), "runId": "r1"})
    source = tmp_path / "in.txt"
    source.write_text("payload")
    operation = {
        "operationId": "op-1",
        "files": [
            {"sourcePath": str(source), "targetPath": "/paperclip-workspace/in.txt", "kind": "file"}
        ],
    }
    params = {
        **s.call(timeout_ms),
        "lease": {**lease, "expiresAt": None},
        "operations": [operation],
    }
    budget = timeout_ms / 1000 + HOST_GRACE  # the host's rule for environmentSyncIn
    s.stall()
    elapsed, error = await timed(lambda: s.methods.sync_in(params))
    assert isinstance(error, ProviderError), error
    assert elapsed < budget
    s.resume()
    await s.methods.destroy(
        {
            **s.call(timeout_ms),
            "providerLeaseId": lease["providerLeaseId"],
            "leaseMetadata": lease["metadata"],
        }
    )
