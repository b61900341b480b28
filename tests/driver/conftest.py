"""Driver tests run the real driver methods against the real emulator (real HTTP, real processes).

``harness`` wires :class:`DriverMethods` to the emulator with request pacing switched off (the
pacing rules have their own tests with the real 300 ms) and records every notification the
driver sends, so tests can assert on live output and on what crossed the wire. The driver's
background tasks run for the test's duration; the reaper reads :class:`FakeClock`, which moves
only when a test advances it. ``Harness.acquire`` acquires as a heartbeat run of an execution
workspace does (``agentId`` and ``executionWorkspaceId`` set, so the lease is reusable when the
config says ``reuseLease``) and waits for the reaper's sweep it may start, so request counts
stay deterministic; ``workspace=False`` acquires a disposable lease.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devtools.call_params import call_config, common_params, lease_ref, with_lease
from provider.config import EnvironmentConfig
from provider.createos.client import CreateOSClient
from provider.createos.pacer import RequestPacer
from provider.driver.core.journal import LeaseJournal
from provider.driver.core.runtime import DriverRuntime
from provider.driver.leases.reaper import Reaper
from provider.driver.service import DriverService as DriverMethods
from provider.emulator import Emulator

SHAPE = "s-1vcpu-1gb"


def unpaced_client(config: EnvironmentConfig, api_key: str) -> CreateOSClient:
    pacer = RequestPacer(config.api_url, interval=0.0, shared_dir=None)
    return CreateOSClient(config.api_url, api_key, pacer=pacer, backoff_base=0.01)


@dataclass
class FakeClock:
    """Wall and monotonic time frozen at the real values of its creation; only ``advance``
    moves them, so a slow machine cannot carry a test across a bound it did not advance to."""

    offset: float = 0.0
    start_wall: float = field(default_factory=time.time)
    start_monotonic: float = field(default_factory=time.monotonic)

    def wall(self) -> float:
        return self.start_wall + self.offset

    def monotonic(self) -> float:
        return self.start_monotonic + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@dataclass
class Harness:
    emulator: Emulator
    methods: DriverMethods
    notifications: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    logs: list[tuple[str, str]] = field(default_factory=list)
    company_id: str = "company-1"
    environment_id: str = "env-1"
    clock: FakeClock = field(default_factory=FakeClock)

    def config(self, **overrides: Any) -> dict[str, Any]:
        # Pause at release, as before the warm window (2.10): tests of the warm path set a
        # window themselves.
        config = {"shape": SHAPE, "autoPauseAfterSeconds": 0, **overrides}
        return call_config(self.emulator.base_url, "test-key", timeout_ms=60_000, **config)

    def call(self, **config_overrides: Any) -> dict[str, Any]:
        return common_params(
            self.config(**config_overrides),
            company_id=self.company_id,
            environment_id=self.environment_id,
        )

    def lease_ref(self, lease: dict[str, Any], **config_overrides: Any) -> dict[str, Any]:
        return lease_ref(self.call(**config_overrides), lease)

    def with_lease(self, lease: dict[str, Any], **config_overrides: Any) -> dict[str, Any]:
        return with_lease(self.call(**config_overrides), lease)

    def acquire_params(self, *, workspace: bool = True, **config_overrides: Any) -> dict[str, Any]:
        params = {**self.call(**config_overrides), "runId": "run-1"}
        if workspace:
            params.update(agentId="agent-1", executionWorkspaceId="workspace-1")
        return params

    async def acquire(self, *, workspace: bool = True, **config_overrides: Any) -> dict[str, Any]:
        params = self.acquire_params(workspace=workspace, **config_overrides)
        lease: dict[str, Any] = await self.methods.acquire(params)
        await self.settle()
        return lease

    async def settle(self) -> None:
        """Wait until the driver's background work (a reaper sweep) has finished."""
        await self.methods.runtime.background.wait_idle()

    async def request_count(self) -> int:
        return len(await self.emulator.admin.requests())

    def live_chunks(self) -> list[tuple[str, str]]:
        return [
            (params["stream"], params["chunk"])
            for method, params in self.notifications
            if method == "execute.log"
        ]


@pytest.fixture
async def harness(emulator: Emulator, tmp_path: Path) -> AsyncIterator[Harness]:
    journal = LeaseJournal(tmp_path / "state" / "leases.sqlite3")
    runtime = DriverRuntime(client_factory=unpaced_client, environ={}, journal=journal)
    notifications: list[tuple[str, dict[str, Any]]] = []
    logs: list[tuple[str, str]] = []

    async def notify(method: str, params: dict[str, Any]) -> None:
        notifications.append((method, params))

    async def log(level: str, message: str, meta: dict[str, Any] | None = None) -> None:
        logs.append((level, message))

    clock = FakeClock()
    reaper = Reaper(runtime, log, wall_clock=clock.wall, monotonic=clock.monotonic)
    methods = DriverMethods(runtime, notify=notify, log=log, reaper=reaper)
    async with runtime.background.running():
        yield Harness(emulator, methods, notifications, logs, clock=clock)
