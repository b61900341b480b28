"""The demo's walk through the environment verbs, one transcript step per host call.

``Walkthrough.run`` takes one reusable lease from validation to destroy: its release is *warm*
(processes stopped, the sandbox left running until CreateOS pauses it when idle; on the emulator
the demo fires that idle timer, on a given endpoint it does not wait for it), and its resume
finds the same sandbox. A second, disposable lease with a restrictive ``egressAllowlist`` shows
a connection to a listener on this machine's loopback refused. Every answer is checked and a
wrong one raises :class:`DemoFailure`. ``cleanup`` (always called) destroys every lease the walk
acquired and did not destroy.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio

from provider.devtools.demo_egress import (
    GREETING,
    RESTRICTED_EGRESS,
    connect_script,
    loopback_listener,
)
from provider.devtools.demo_hosts import HostReport, WorkerHost
from provider.devtools.demo_project import (
    CHECK_SCRIPT,
    EXCLUDED,
    RELEASE_NOTES,
    REPORT_MARKER,
    REPORT_RELATIVE,
    SANDBOX_PROJECT,
    synced_file_count,
    write_project,
)
from provider.devtools.demo_transcript import Transcript
from provider.emulator import Emulator

if TYPE_CHECKING:
    from provider.devtools.demo import DemoOptions

TIMEOUT_MS: Final = 300_000
CALL_SLACK_MS: Final = 30_000
COMMAND_TIMEOUT_MS: Final = 120_000
IDLE_PAUSE_WAIT_S: Final = 30.0
WORKSPACE_ROOT: Final = "/paperclip-workspace"
PROBE_TIMEOUT_MS: Final = 120_000
COMPANY_ID: Final = "demo-company"
ENVIRONMENT_ID: Final = "demo-environment"


class DemoFailure(Exception):
    """A step got an answer other than the one the demo expects."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise DemoFailure(message)


class Walkthrough:
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
        self.config: dict[str, Any] = {
            "apiUrl": api_url,
            "apiKey": options.api_key,
            "shape": options.shape,
            "timeoutMs": TIMEOUT_MS,
            "reuseLease": True,
        }
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
        return {
            "driverKey": "createos",
            "companyId": COMPANY_ID,
            "environmentId": ENVIRONMENT_ID,
            "config": dict(self.config if config is None else config),
        }

    def lease_ref(
        self, lease: dict[str, Any] | None = None, config: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Release, resume and destroy params of ``lease`` (default: the reusable one)."""
        lease = self.lease if lease is None else lease
        assert lease is not None
        return {
            **self.common(config),
            "providerLeaseId": lease["providerLeaseId"],
            "leaseMetadata": lease["metadata"],
        }

    def with_lease(
        self, lease: dict[str, Any] | None = None, config: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        lease = self.lease if lease is None else lease
        assert lease is not None
        return {**self.common(config), "lease": {**lease, "expiresAt": None}}

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

    # -- the walk ----------------------------------------------------------------------------

    async def run(self) -> None:
        project = await anyio.to_thread.run_sync(write_project, self.work_dir)
        out_dir = self.work_dir / "from-sandbox"

        with self.t.step("Validate the config (and refuse a bad one)"):
            answer = await self.call(
                "environmentValidateConfig",
                {"driverKey": "createos", "config": self.config},
                30_000,
            )
            expect(answer.get("ok") is True, f"config refused: {answer.get('errors')}")
            shown = {k: v for k, v in answer["normalizedConfig"].items() if k != "apiKey"}
            self.t.detail("normalized", json.dumps(shown))
            for warning in answer.get("warnings") or []:
                self.t.detail("warning", warning)
            bad = {**self.config, "apiUrl": "http://remote.example", "timeoutMs": "500"}
            refused = await self.call(
                "environmentValidateConfig", {"driverKey": "createos", "config": bad}, 30_000
            )
            expect(refused.get("ok") is False, "a plain-http remote apiUrl was accepted")
            self.t.detail("bad config", f"refused with {len(refused.get('errors') or [])} errors:")
            for error in refused.get("errors") or []:
                self.t.note(f"  - {error}")

        with self.t.step("Probe: create a sandbox, run a command, delete it"):
            probe = await self.call("environmentProbe", self.common(), PROBE_TIMEOUT_MS)
            self.t.detail("summary", str(probe.get("summary")))
            expect(probe.get("ok") is True, "the probe failed")

        with self.t.step("Acquire a reusable lease"):
            self.lease = await self.lease_call(
                "environmentAcquireLease",
                # A run of an execution workspace: only such a lease is kept on release.
                {
                    **self.common(),
                    "runId": "demo-run",
                    "agentId": "demo-agent",
                    "executionWorkspaceId": "demo-workspace",
                },
            )
            assert self.lease is not None
            expect(bool(self.lease.get("providerLeaseId")), "acquire returned no lease id")
            metadata = self.lease["metadata"]
            self.t.detail("sandbox", self.lease["providerLeaseId"])
            self.t.detail("marker", str(metadata.get("marker")))
            self.t.detail("reuseLease", str(metadata.get("reuseLease")))
            await self.show_sandbox_status()

        with self.t.step("Realize the workspace"):
            realized = await self.lease_call(
                "environmentRealizeWorkspace",
                {**self.with_lease(), "workspace": {"localPath": str(project)}},
            )
            self.t.detail("cwd", str(realized.get("cwd")))
            expect(realized.get("cwd") == "/paperclip-workspace", "unexpected workspace cwd")

        with self.t.step(f"Sync the project in (excluding {EXCLUDED}/)"):
            mapping = {
                "sourcePath": str(project),
                "targetPath": SANDBOX_PROJECT,
                "kind": "directory",
                "exclude": [EXCLUDED],
            }
            synced = await self.lease_call(
                "environmentSyncIn",
                {
                    **self.with_lease(),
                    "operations": [{"operationId": "project", "files": [mapping]}],
                },
            )
            op = synced["operations"][0]
            self.synced = (int(op["filesTransferred"]), int(op["bytesTransferred"]))
            self.t.detail("transferred", f"{self.synced[0]} files, {self.synced[1]} bytes (tar)")
            self.t.detail("to", SANDBOX_PROJECT)
            expect(self.synced[0] == synced_file_count(), "unexpected number of files synced")

        with self.t.step("Run the build; its output streams live"):
            self.t.note("$ BUILD_MODE=release bash build.sh <<< release notes")
            result = await self.execute(
                ["build.sh"], env={"BUILD_MODE": "release"}, stdin=RELEASE_NOTES
            )
            expect(
                self.live_chunks["stdout"] > 0 and self.live_chunks["stderr"] > 0,
                "no live output arrived on both streams",
            )
            expect("node_modules: excluded" in result["stdout"], "the exclusion did not hold")

        with self.t.step("Sync the build report out"):
            target = out_dir / "report.txt"
            mapping = {
                "sourcePath": f"{SANDBOX_PROJECT}/{REPORT_RELATIVE}",
                "targetPath": str(target),
                "kind": "file",
            }
            await self.lease_call(
                "environmentSyncOut",
                {
                    **self.with_lease(),
                    "operations": [{"operationId": "report", "files": [mapping]}],
                },
            )
            text = await anyio.to_thread.run_sync(target.read_text)
            mode = await anyio.to_thread.run_sync(lambda: target.stat().st_mode & 0o777)
            self.t.detail("host file", f"{target} (mode {mode:o})")
            for line in text.splitlines():
                self.t.note(f"  | {line}")
            expect(REPORT_MARKER in text and RELEASE_NOTES in text, "the report is not the build's")

        with self.t.step("Release with reuse: kept warm, paused when idle"):
            await self.release_warm()

        with self.t.step("Resume the same sandbox"):
            assert self.lease is not None
            resumed = await self.lease_call("environmentResumeLease", self.lease_ref())
            self.t.detail("sandbox", str(resumed.get("providerLeaseId")))
            same = resumed.get("providerLeaseId") == self.lease["providerLeaseId"]
            expect(same, "resume did not hand back the same sandbox")
            self.lease = resumed
            self.t.detail("resumedLease", str(resumed["metadata"].get("resumedLease")))
            await self.show_sandbox_status()

        with self.t.step("Run again: the workspace survived"):
            result = await self.execute(["-c", CHECK_SCRIPT])
            expect(f"report survived: {REPORT_MARKER}" in result["stdout"], "the report is gone")

        with self.t.step("Egress allowlist: a restricted lease cannot reach this machine"):
            await self.restricted_egress()

        with self.t.step("Destroy the lease"):
            receipt = await self.lease_call("environmentDestroyLease", self.lease_ref())
            self.t.detail("receipt", json.dumps(receipt))
            expect(receipt.get("state") == "destroyed", "destroy was not confirmed")
            self.destroyed = True
            await self.show_sandbox_status()

    async def release_warm(self) -> None:
        """Release a reusable lease: kept warm (running), then paused by CreateOS when idle."""
        assert self.lease is not None
        receipt = await self.lease_call("environmentReleaseLease", self.lease_ref())
        self.t.detail("receipt", json.dumps(receipt))
        expect(receipt.get("state") == "stopped", "release did not keep the sandbox")
        status = await self.show_sandbox_status()
        expect(status in (None, "running"), f"a warm release left the sandbox {status}")
        if status is not None:
            self.t.note("warm: its processes were stopped, the sandbox was left running")
        window = self.lease["metadata"].get("autoPauseAfterSeconds")
        if self.emulator is None:
            self.t.detail(
                "idle pause",
                f"CreateOS pauses it after {window} s without activity "
                "(not waited for here: resume takes it running or paused)",
            )
            return
        self.t.detail(
            "idle pause", f"CreateOS pauses it after {window} s idle: the emulator fires it now"
        )
        await self.emulator.admin.idle_pause(self.lease["providerLeaseId"])
        await self.wait_for_status("paused")
        await self.show_sandbox_status()

    async def restricted_egress(self) -> None:
        """A disposable lease with a restrictive ``egressAllowlist`` tries a listener on this
        machine's 127.0.0.1 and is refused (on the emulator the reusable lease, which allows
        all, reaches it first), then is destroyed."""
        config = {**self.config, "egressAllowlist": list(RESTRICTED_EGRESS)}
        async with loopback_listener() as listener:
            script = connect_script(listener.port)
            self.t.detail("listener", f"127.0.0.1:{listener.port} on this machine ({GREETING!r})")
            if self.emulator is not None:
                self.t.note("the reusable lease allows all egress (the host's network):")
                self.t.note(f"$ {script}")
                result = await self.execute(["-c", script])
                expect(f"connected: {GREETING}" in result["stdout"], "the control did not connect")
            else:
                self.t.note("(a remote sandbox never reaches this machine's loopback anyway:")
                self.t.note(" this shows the restricted lease's command refused, not why)")
            lease = await self.lease_call(
                "environmentAcquireLease",
                # No execution workspace or agent: a disposable lease, deleted at release.
                {**self.common(config), "runId": "demo-egress-run"},
            )
            self.egress_lease = (lease, config)
            metadata = lease["metadata"]
            self.t.detail("sandbox", lease["providerLeaseId"])
            self.t.detail("egress", json.dumps(metadata.get("effectiveEgressAllowlist")))
            self.t.detail("reuseLease", str(metadata.get("reuseLease")))
            expect(
                metadata.get("effectiveEgressAllowlist") == list(RESTRICTED_EGRESS),
                "the lease does not carry the egress allowlist",
            )
            await self.show_sandbox_status(lease, network=True)
            before = listener.connections
            self.t.note(f"$ {script}")
            result = await self.execute(
                ["-c", script], lease=lease, config=config, cwd=WORKSPACE_ROOT, must_succeed=False
            )
            expect(result.get("exitCode") != 0, "the restricted lease's connection succeeded")
            expect("connected:" not in result["stdout"], "the restricted lease got the greeting")
            expect(listener.connections == before, "a connection reached the host's listener")
            self.t.detail("listener", "no connection arrived from the restricted lease")
        receipt = await self.lease_call("environmentDestroyLease", self.lease_ref(lease, config))
        self.t.detail("receipt", json.dumps(receipt))
        expect(receipt.get("state") == "destroyed", "destroy was not confirmed")
        self.egress_lease = None
        await self.show_sandbox_status(lease)

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
