"""The demo's session with a worker host: call params, host calls, the API's own view of a
sandbox (on the emulator), the one way the demo runs a command, and the cleanup and facts
every walk ends with. The steps themselves are :mod:`devtools.demo_walkthrough`'s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Final

import anyio

from devtools.call_params import call_config, common_params, lease_ref, with_lease
from devtools.demo_hosts import HostReport, WorkerHost
from devtools.demo_options import DemoOptions
from devtools.demo_project import SANDBOX_PROJECT
from devtools.demo_transcript import Transcript
from provider.emulator import Emulator

TIMEOUT_MS: Final = 300_000
CALL_SLACK_MS: Final = 30_000
COMMAND_TIMEOUT_MS: Final = 120_000
IDLE_PAUSE_WAIT_S: Final = 30.0
COMPANY_ID: Final = "demo-company"
ENVIRONMENT_ID: Final = "demo-environment"


class DemoFailure(Exception):
    """A step got an answer other than the one the demo expects."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise DemoFailure(message)


class DemoSession:
    """What every step of the walk uses; the leases it holds, and what it cleans up."""

    def __init__(
        self,
        host: WorkerHost,
        transcript: Transcript,
        emulator: Emulator | None,
        work_dir: Path,
        api_url: str,
        options: DemoOptions,
    ) -> None:
        self.host = host
        self.t = transcript
        self.emulator = emulator
        self.work_dir = work_dir
        self.config = call_config(
            api_url, options.api_key, shape=options.shape, timeout_ms=TIMEOUT_MS, reuse_lease=True
        )
        if options.rootfs:
            self.config["rootfs"] = options.rootfs
        self.lease: dict[str, Any] | None = None
        self.destroyed = False
        # The egress step's disposable lease (its own config) while it is not destroyed.
        self.egress_lease: tuple[dict[str, Any], dict[str, Any]] | None = None
        self.cleanup_ok = True
        self.live_chunks: dict[str, int] = {"stdout": 0, "stderr": 0}
        self.synced: tuple[int, int] = (0, 0)

    # -- helpers -----------------------------------------------------------------------------

    def common(self, config: dict[str, Any] | None = None) -> dict[str, Any]:
        return common_params(
            self.config if config is None else config,
            company_id=COMPANY_ID,
            environment_id=ENVIRONMENT_ID,
        )

    def lease_ref(
        self, lease: dict[str, Any] | None = None, config: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Release, resume and destroy params of ``lease`` (default: the reusable one)."""
        lease = self.lease if lease is None else lease
        assert lease is not None
        return lease_ref(self.common(config), lease)

    def with_lease(
        self, lease: dict[str, Any] | None = None, config: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        lease = self.lease if lease is None else lease
        assert lease is not None
        return with_lease(self.common(config), lease)

    async def call(self, method: str, params: dict[str, Any], timeout_ms: int) -> Any:
        return await self.host.call(method, params, timeout_ms=timeout_ms)

    async def lease_call(self, method: str, params: dict[str, Any]) -> Any:
        return await self.call(method, params, TIMEOUT_MS + CALL_SLACK_MS)

    async def api_view(self, lease: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """On the emulator, the API's own view of the lease's sandbox (``{}`` once it is gone);
        None on a given endpoint, whose sandboxes the demo cannot look at from outside."""
        lease = self.lease if lease is None else lease
        if self.emulator is None or lease is None:
            return None
        for sandbox in (await self.emulator.admin.state())["sandboxes"]:
            if sandbox["id"] == lease["providerLeaseId"]:
                return dict(sandbox)
        return {}

    async def show_sandbox_status(
        self, lease: dict[str, Any] | None = None, *, network: bool = False
    ) -> str | None:
        """On the emulator, what the API itself reports for the sandbox (and its network)."""
        view = await self.api_view(lease)
        if view is None:
            return None
        status = str(view.get("status", "gone"))
        suffix = f", network {view['network']}" if network and "network" in view else ""
        self.t.detail("API status", status + suffix)
        return status

    async def wait_for_status(self, wanted: str) -> None:
        """On the emulator, until the sandbox reports ``wanted`` (admin reads are not activity)."""
        with anyio.move_on_after(IDLE_PAUSE_WAIT_S):
            while True:
                view = await self.api_view()
                if view is None or view.get("status") == wanted:
                    return
                await anyio.sleep(0.05)
        raise DemoFailure(f"the sandbox did not become {wanted} in {IDLE_PAUSE_WAIT_S:g} s")

    async def execute(
        self,
        args: list[str],
        *,
        lease: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        must_succeed: bool = True,
        **extra: Any,
    ) -> dict[str, Any]:
        params = {
            **self.with_lease(lease, config),
            "command": "bash",
            "args": args,
            "cwd": SANDBOX_PROJECT,
            "timeoutMs": COMMAND_TIMEOUT_MS,
            **extra,
        }
        started = time.perf_counter()
        first: list[float] = []

        def on_log(stream: str, chunk: str) -> None:
            if not first:
                first.append(time.perf_counter() - started)
            self.live_chunks[stream] = self.live_chunks.get(stream, 0) + 1
            self.t.live(stream, chunk)

        before = dict(self.live_chunks)
        result: dict[str, Any] = await self.host.call(
            "environmentExecute",
            params,
            timeout_ms=COMMAND_TIMEOUT_MS + CALL_SLACK_MS,
            on_log=on_log,
        )
        counts = {s: self.live_chunks[s] - before.get(s, 0) for s in self.live_chunks}
        self.t.detail("exit code", f"{result.get('exitCode')} (timedOut {result.get('timedOut')})")
        self.t.detail(
            "live chunks",
            f"{counts['stdout']} stdout + {counts['stderr']} stderr"
            + (f", first after {first[0]:.2f} s" if first else ""),
        )
        if must_succeed:
            expect(
                result.get("exitCode") == 0 and result.get("timedOut") is False, "command failed"
            )
        return result

    async def cleanup(self) -> None:
        """Destroy every lease the walk stopped before destroying (shielded, bounded)."""
        if self.egress_lease is not None:
            lease, config = self.egress_lease
            if await self._destroy_left(lease, config):
                self.egress_lease = None
        if self.lease is None or self.destroyed or not self.lease.get("providerLeaseId"):
            return
        self.destroyed = await self._destroy_left(self.lease, self.config)

    async def _destroy_left(self, lease: dict[str, Any], config: dict[str, Any]) -> bool:
        lease_id = lease["providerLeaseId"]
        self.t.note(f"cleanup: destroying sandbox {lease_id}")
        destroyed = False
        with anyio.CancelScope(shield=True), anyio.move_on_after(TIMEOUT_MS / 1000 + 30):
            try:
                receipt = await self.lease_call(
                    "environmentDestroyLease", self.lease_ref(lease, config)
                )
            except Exception as exc:
                self.t.note(f"WARNING: sandbox {lease_id} may be left behind: {exc}")
                self.cleanup_ok = False
                return False
            destroyed = receipt is not None and receipt.get("state") == "destroyed"
            self.t.note(f"cleanup: {json.dumps(receipt)}")
        if not destroyed:
            self.t.note(f"WARNING: sandbox {lease_id} may be left behind")
            self.cleanup_ok = False
        return destroyed

    def facts(self, report: HostReport) -> list[tuple[str, str]]:
        lease_id = self.lease.get("providerLeaseId") if self.lease else None
        if lease_id is None:
            sandbox = "none acquired"
        else:
            sandbox = f"{lease_id} ({'destroyed' if self.destroyed else 'NOT destroyed'})"
        facts = [("host", self.host.name), ("sandbox", sandbox)]
        if self.egress_lease is not None:
            facts.append(
                ("egress lease", f"{self.egress_lease[0]['providerLeaseId']} (NOT destroyed)")
            )
        return [
            *facts,
            ("synced in", f"{self.synced[0]} files, {self.synced[1]} bytes"),
            (
                "live output",
                f"{self.live_chunks['stdout']} stdout + {self.live_chunks['stderr']} stderr chunks",
            ),
            ("left running", ", ".join(map(str, report.processes_left)) or "no worker process"),
        ]
