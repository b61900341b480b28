"""``LiveSession``: environment calls through a running worker, with the test's config built in.

The API key lives only inside the session's config (hidden from ``repr``); tests pass leases
and paths around, never the config, so a failing assertion cannot show the key.

Duplex channels and login terminals send notifications named by ``hostRouteId``; a session
built with a :class:`RouteLog` (the Python stdio host's ``on_notification``) keeps them per route.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import anyio

from devtools.call_params import (
    bash,
    common_params,
    lease_ref,
    route_params,
    validate_params,
    with_lease,
)
from devtools.demo_hosts import WorkerHost
from provider.emulator import Emulator

TIMEOUT_MS: Final = 300_000
ROUTE_WAIT_S: Final = 60.0
CALL_BUDGET_MS: Final = TIMEOUT_MS + 30_000
COMMAND_TIMEOUT_MS: Final = 120_000
CLEANUP_BUDGET_S: Final = CALL_BUDGET_MS / 1000 + 10
STATUS_WAIT_S: Final = 30.0


class CleanupFailed(AssertionError):
    """The lease could not be destroyed: a sandbox may be left behind (its id is given)."""


@dataclass
class ExecuteOutcome:
    result: dict[str, Any]
    live: list[tuple[str, str]]

    def live_text(self, stream: str) -> str:
        return "".join(chunk for s, chunk in self.live if s == stream)


class RouteLog:
    """Every ``duplexChannel.*`` / ``loginPty.*`` notification, kept per ``hostRouteId``."""

    def __init__(self) -> None:
        self.by_route: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        self.unrouted: list[tuple[str, dict[str, Any]]] = []
        self._changed: anyio.Event | None = None  # set by the next notification

    def __call__(self, method: str, params: dict[str, Any]) -> None:
        route = params.get("hostRouteId")
        if isinstance(route, str):
            self.by_route.setdefault(route, []).append((method, params))
        else:
            self.unrouted.append((method, params))
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def of(self, route: str, method: str | None = None) -> list[dict[str, Any]]:
        return [p for m, p in self.by_route.get(route, []) if method is None or m == method]

    def methods(self, route: str) -> list[str]:
        return [m for m, _ in self.by_route.get(route, [])]

    def channel_bytes(self, route: str) -> bytes:
        chunks = self.of(route, "duplexChannel.data")
        return b"".join(base64.b64decode(p["chunk"], validate=True) for p in chunks)

    def pty_text(self, route: str) -> str:
        return "".join(p["chunk"] for p in self.of(route, "loginPty.output"))

    async def until(self, check: Callable[[], bool], what: str) -> None:
        with anyio.move_on_after(ROUTE_WAIT_S):
            while not check():
                if self._changed is None:
                    self._changed = anyio.Event()
                await self._changed.wait()
            return
        raise AssertionError(f"waited {ROUTE_WAIT_S:g} s for {what}")


@dataclass
class LiveSession:
    host: WorkerHost = field(repr=False)
    config: dict[str, Any] = field(repr=False)
    emulator: Emulator | None = field(default=None, repr=False)
    routes: RouteLog | None = field(default=None, repr=False)
    company_id: str = "live-smoke-company"
    environment_id: str = field(default_factory=lambda: f"live-smoke-{uuid.uuid4().hex[:12]}")

    def common(self) -> dict[str, Any]:
        return common_params(
            self.config, company_id=self.company_id, environment_id=self.environment_id
        )

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        return await self.host.call(method, params, timeout_ms=CALL_BUDGET_MS)

    async def validate(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self.call(
            "environmentValidateConfig", validate_params(self.config)
        )
        return answer

    async def acquire(self) -> dict[str, Any]:
        lease: dict[str, Any] = await self.call(
            "environmentAcquireLease",
            # A heartbeat run of an execution workspace: only such a lease is kept on release.
            {
                **self.common(),
                "runId": "live-smoke",
                "agentId": "live-smoke-agent",
                "executionWorkspaceId": "live-smoke-workspace",
            },
        )
        return lease

    def _ref(self, lease: dict[str, Any]) -> dict[str, Any]:
        return lease_ref(self.common(), lease)

    def _with(self, lease: dict[str, Any]) -> dict[str, Any]:
        return with_lease(self.common(), lease)

    async def release(self, lease: dict[str, Any]) -> Any:
        return await self.call("environmentReleaseLease", self._ref(lease))

    async def resume(self, lease: dict[str, Any]) -> Any:
        return await self.call("environmentResumeLease", self._ref(lease))

    async def destroy(self, lease: dict[str, Any]) -> Any:
        return await self.call("environmentDestroyLease", self._ref(lease))

    async def sync(self, direction: str, lease: dict[str, Any], mapping: dict[str, Any]) -> Any:
        method = "environmentSyncIn" if direction == "in" else "environmentSyncOut"
        operation = {"operationId": f"live-{direction}", "files": [mapping]}
        return await self.call(method, {**self._with(lease), "operations": [operation]})

    async def execute(self, lease: dict[str, Any], script: str, **extra: Any) -> ExecuteOutcome:
        """``bash -c script`` in the workspace; live chunks are collected as they arrive."""
        live: list[tuple[str, str]] = []
        params = bash(self._with(lease), script, **{"timeoutMs": COMMAND_TIMEOUT_MS, **extra})
        result = await self.host.call(
            "environmentExecute",
            params,
            timeout_ms=COMMAND_TIMEOUT_MS + 30_000,
            on_log=lambda stream, chunk: live.append((stream, chunk)),
        )
        return ExecuteOutcome(result, live)

    def _route_params(self, lease: dict[str, Any], route: str) -> dict[str, Any]:
        return route_params(self.common(), lease, route)

    async def open_channel(self, lease: dict[str, Any], route: str, command: list[str]) -> Any:
        """``duplexChannelOpen`` (the host's route ids look like ``duplex-route-<n>``)."""
        return await self.call(
            "duplexChannelOpen", {**self._route_params(lease, route), "command": command}
        )

    async def write_channel(self, route: str, session_id: str, data: bytes) -> Any:
        return await self.call(
            "duplexChannelWrite",
            {
                "hostRouteId": route,
                "workerSessionId": session_id,
                "data": base64.b64encode(data).decode("ascii"),
            },
        )

    async def open_login(
        self, lease: dict[str, Any], route: str, key: str, session_home: str
    ) -> Any:
        """``loginPtyOpen`` (the host's route ids are random UUIDs)."""
        return await self.call(
            "loginPtyOpen",
            {
                **self._route_params(lease, route),
                "loginCommandKey": key,
                "sessionHome": session_home,
            },
        )

    async def sandbox_view(self, sandbox_id: str) -> dict[str, Any] | None:
        """The emulator's own view of a live sandbox (``status``, ``network``, ...): ``{}`` when
        it is gone, None on a real endpoint. Admin reads are not sandbox activity."""
        if self.emulator is None:
            return None
        for sandbox in (await self.emulator.admin.state())["sandboxes"]:
            if sandbox["id"] == sandbox_id:
                return dict(sandbox)
        return {}

    async def sandbox_status(self, sandbox_id: str) -> str | None:
        """The emulator's status of a sandbox (``gone`` when gone; None on a real endpoint)."""
        view = await self.sandbox_view(sandbox_id)
        return None if view is None else str(view.get("status", "gone"))

    async def wait_for_status(self, sandbox_id: str, wanted: str) -> None:
        """On the emulator, until the sandbox reports ``wanted`` (nothing on a real endpoint)."""
        status: str | None = None
        with anyio.move_on_after(STATUS_WAIT_S):
            while True:  # polled: the emulator has no status feed
                status = await self.sandbox_status(sandbox_id)
                if status in (None, wanted):
                    return
                await anyio.sleep(0.05)
        raise AssertionError(f"sandbox {sandbox_id} stayed {status}, not {wanted}")

    async def tree_alive_processes(self, sandbox_id: str) -> list[str]:
        """On the emulator, the process ids of the sandbox whose tree still runs."""
        if self.emulator is None:
            return []
        state = await self.emulator.admin.state()
        return [
            str(p["process_id"])
            for p in state["processes"]
            if p["sandbox_id"] == sandbox_id and p["tree_alive"]
        ]

    @asynccontextmanager
    async def reusable_lease(self) -> AsyncIterator[dict[str, Any]]:
        """Acquire a reusable lease; destroy it on the way out, failing if that fails.

        The body may replace the yielded dict's contents (after a resume); the destroy uses
        whatever it holds last.
        """
        lease = await self.acquire()
        holder = dict(lease)
        try:
            yield holder
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_BUDGET_S) as scope:
                sandbox_id = holder.get("providerLeaseId")
                try:
                    receipt = await self.destroy(holder)
                except Exception as exc:
                    raise CleanupFailed(
                        f"destroying sandbox {sandbox_id} failed ({exc}): it may be left behind"
                    ) from exc
                if receipt != {"providerLeaseId": sandbox_id, "state": "destroyed"}:
                    raise CleanupFailed(f"sandbox {sandbox_id} not confirmed destroyed: {receipt}")
            if scope.cancelled_caught:
                raise CleanupFailed(f"destroying sandbox {sandbox_id} timed out")
