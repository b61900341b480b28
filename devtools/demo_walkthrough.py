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
from typing import Final

import anyio

from devtools.call_params import validate_params
from devtools.demo_egress import (
    GREETING,
    RESTRICTED_EGRESS,
    connect_script,
    loopback_listener,
)
from devtools.demo_project import (
    CHECK_SCRIPT,
    EXCLUDED,
    RELEASE_NOTES,
    REPORT_MARKER,
    REPORT_RELATIVE,
    SANDBOX_PROJECT,
    synced_file_count,
    write_project,
)
from devtools.demo_session import DemoFailure, DemoSession, expect

WORKSPACE_ROOT: Final = "/paperclip-workspace"
PROBE_TIMEOUT_MS: Final = 120_000

__all__ = ["DemoFailure", "Walkthrough"]


class Walkthrough(DemoSession):
    """The steps of the demo, in order (see the module docstring)."""

    async def run(self) -> None:
        project = await anyio.to_thread.run_sync(write_project, self.work_dir)
        out_dir = self.work_dir / "from-sandbox"

        with self.t.step("Validate the config (and refuse a bad one)"):
            answer = await self.call(
                "environmentValidateConfig",
                validate_params(self.config),
                30_000,
            )
            expect(answer.get("ok") is True, f"config refused: {answer.get('errors')}")
            shown = {k: v for k, v in answer["normalizedConfig"].items() if k != "apiKey"}
            self.t.detail("normalized", json.dumps(shown))
            for warning in answer.get("warnings") or []:
                self.t.detail("warning", warning)
            bad = {**self.config, "apiUrl": "http://remote.example", "timeoutMs": "500"}
            refused = await self.call("environmentValidateConfig", validate_params(bad), 30_000)
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
                self.t.note("the reusable lease allows all egress (it reaches this machine):")
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
