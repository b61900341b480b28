"""The demo end to end, as an operator runs it: ``python -m devtools.demo``.

Each test runs the demo as its own process and reads its transcript (the last one drives the
walk's cleanup with a stand-in host). The worker paces its requests with the real 300 ms, so a
full walk takes about 10 s.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from devtools.demo_hosts import node_available
from devtools.demo_options import DemoOptions
from devtools.demo_transcript import Transcript
from devtools.demo_walkthrough import Walkthrough
from provider.emulator import BwrapUnavailable, Emulator
from provider.emulator.bwrap import probe_runtime

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO = [sys.executable, "-m", "devtools.demo"]
RUN_TIMEOUT_S = 300
STEPS = 15  # endpoint, worker, validate, probe, acquire ... egress, destroy, stop


def demo_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CREATEOS_API_KEY"}
    env.update(extra)
    return env


def require_bwrap() -> None:
    try:
        probe_runtime()
    except BwrapUnavailable as exc:
        pytest.skip(str(exc))


def run_demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DEMO, *args],
        cwd=REPO_ROOT,
        env=env or demo_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def assert_full_walk(out: str, *, api_view: bool = True) -> None:
    """The transcript's key lines, in order (``api_view``: the emulator's status lines)."""
    expected_in_order = [
        "[ 1] Start the CreateOS endpoint",
        "[ 2] Start the worker under the host",
        "23 supported methods",
        "bad config    refused with 2 errors",
        "summary       Created a s-1vcpu-1gb CreateOS sandbox",
        "[ 5] Acquire a reusable lease",
        "transferred   5 files",
        "stdout | build: mode=release sources=3",
        "stdout | [lint] start",
        "stderr | warning: 1 test skipped (needs a GPU)",
        "stdout | node_modules: excluded",
        "exit code     0 (timedOut False)",
        "| notes: first build from the Paperclip demo",
        "[10] Release with reuse: kept warm, paused when idle",
        '"state": "stopped"}',
        *(
            [
                "API status    running",
                "idle pause    CreateOS pauses it after 600 s idle: the emulator fires it now",
                "API status    paused",
            ]
            if api_view
            else ["idle pause    CreateOS pauses it after 600 s without activity"]
        ),
        "[11] Resume the same sandbox",
        "resumedLease  True",
        *(["API status    running"] if api_view else []),
        "stdout | report survived: build report: demo-project",
        "[13] Egress allowlist: a restricted lease cannot reach this machine",
        *(["stdout | connected: hello from the host"] if api_view else []),
        'egress        ["example.com"]',
        "reuseLease    False",
        *(["API status    running, network loopback-only"] if api_view else []),
        "stderr | bash: connect: Connection refused",
        "exit code     1 (timedOut False)",
        "listener      no connection arrived from the restricted lease",
        '"state": "destroyed"}',
        *(["API status    gone"] if api_view else []),
        "[14] Destroy the lease",
        '"state": "destroyed"}',
        "processes     none left running",
        "Summary: every step passed",
        "left running  no worker process",
    ]
    position = 0
    for line in expected_in_order:
        found = out.find(line, position)
        assert found >= 0, f"missing (or out of order): {line!r}\n{out}"
        position = found + len(line)
    step_rows = re.findall(r"^\s+\d+\. .+\s+[\d.]+ s  (ok|FAILED)$", out, re.MULTILINE)
    assert step_rows == ["ok"] * STEPS, out
    assert "total wall time" in out


def work_folder(out: str) -> Path:
    match = re.search(r"^  work folder\s+(\S+)$", out, re.MULTILINE)
    assert match is not None, out
    return Path(match.group(1))


@pytest.mark.host
def test_demo_walks_every_verb_under_the_real_worker_manager() -> None:
    require_bwrap()
    if not node_available():
        pytest.skip("node/npm are not on PATH")
    result = run_demo("--host", "node")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "the real Paperclip worker manager (@paperclipai/server 2026.916.1" in out
    assert_full_walk(out)
    assert not work_folder(out).exists()  # removed after a passing run


@pytest.mark.anyio
async def test_demo_on_a_given_endpoint_with_the_python_host_never_prints_the_key() -> None:
    secret = "demo-test-secret-5f2c9a"
    await anyio.to_thread.run_sync(require_bwrap)
    async with Emulator(api_keys=[secret]) as emulator:
        result = await anyio.run_process(
            [*DEMO, "--api-url", f"{emulator.base_url}/v1/", "--host", "python"],
            cwd=REPO_ROOT,
            env=demo_env(CREATEOS_API_KEY=secret),
            check=False,
        )
        sandboxes = (await emulator.admin.state())["sandboxes"]
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, out + err
    assert "the Python stdio host" in out
    assert f"CreateOS      {emulator.base_url} (given with --api-url)" in out
    assert secret not in out and secret not in err
    # On a given endpoint the demo cannot read the API's own view; everything else is the same.
    assert "API status" not in out
    assert_full_walk(out, api_view=False)
    assert all(s["status"] in ("destroyed", "destroying") for s in sandboxes), sandboxes


@pytest.mark.anyio
async def test_a_step_failing_after_acquire_still_destroys_the_lease() -> None:
    await anyio.to_thread.run_sync(require_bwrap)
    async with Emulator(api_keys=["demo-key"]) as emulator:
        # Only the warm release lists a sandbox's processes (GET .../processes): it fails after
        # acquire, sync and build, with the lease still held.
        await emulator.admin.add_fault("GET", r"/processes$", status=400, times=20)
        result = await anyio.run_process(
            [*DEMO, "--api-url", emulator.base_url, "--host", "python"],
            cwd=REPO_ROOT,
            env=demo_env(CREATEOS_API_KEY="demo-key"),
            check=False,
        )
        sandboxes = (await emulator.admin.state())["sandboxes"]
    out = result.stdout.decode()
    assert result.returncode == 1, out + result.stderr.decode()
    failed = re.search(r"^\[10\] Release with reuse.*\n(?:.*\n)*?\s+FAILED after", out, re.M)
    assert failed is not None, out
    match = re.search(r"cleanup: destroying sandbox (sb_\w+)", out)
    assert match is not None, out
    assert f'cleanup: {{"providerLeaseId": "{match.group(1)}", "state": "destroyed"}}' in out
    assert f"sandbox       {match.group(1)} (destroyed)" in out
    assert "Summary: the demo FAILED" in out
    assert [s for s in sandboxes if s["status"] not in ("destroyed", "destroying")] == []


def test_demo_exits_non_zero_and_cleans_up_when_a_step_fails() -> None:
    require_bwrap()
    # The emulator rejects a shape outside its catalog: validation warns, the probe fails.
    result = run_demo("--host", "python", "--shape", "s-3vcpu-unknown")
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "is not in the bundled CreateOS catalog" in out
    assert "FAILED after" in out and "the probe failed" in out
    assert "Summary: the demo FAILED" in out
    assert "[ 5]" not in out  # nothing ran after the failed step
    assert "left running  no worker process" in out
    kept = work_folder(out)
    assert f"logs and files kept in {kept}" in out
    assert (kept / "worker-stderr.log").exists()
    subprocess.run(["rm", "-rf", str(kept)], check=True)


def test_demo_refuses_a_given_endpoint_without_a_key() -> None:
    result = run_demo("--api-url", "https://api.sb.createos.sh")
    assert result.returncode == 2
    assert "set CREATEOS_API_KEY or pass --api-key-file" in result.stderr
    assert result.stdout == ""


class RecordingHost:
    """A stand-in host: answers every destroy as confirmed and keeps the calls."""

    name = "recording host"
    supported_methods: list[str] = []
    start_ms = 0.0
    worker_pids: list[int] = []

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        timeout_ms: int = 30_000,
        on_log: Any = None,
    ) -> Any:
        self.calls.append((method, dict(params)))
        return {"providerLeaseId": params["providerLeaseId"], "state": "destroyed"}


@pytest.mark.anyio
async def test_cleanup_destroys_the_egress_lease_and_the_reusable_one(tmp_path: Path) -> None:
    host = RecordingHost()
    options = DemoOptions(
        "https://api.example", "k3y-never-shown", "s-1vcpu-1gb", None, "python", False
    )
    walk = Walkthrough(
        host, Transcript(io.StringIO()), None, tmp_path, "https://api.example", options
    )
    walk.lease = {"providerLeaseId": "sb_reusable", "metadata": {"reuseLease": True}}
    restricted = {**walk.config, "egressAllowlist": ["example.com"]}
    walk.egress_lease = ({"providerLeaseId": "sb_restricted", "metadata": {}}, restricted)
    await walk.cleanup()
    assert [(m, p["providerLeaseId"]) for m, p in host.calls] == [
        ("environmentDestroyLease", "sb_restricted"),
        ("environmentDestroyLease", "sb_reusable"),
    ]
    # each with the config it was acquired under
    assert host.calls[0][1]["config"]["egressAllowlist"] == ["example.com"]
    assert "egressAllowlist" not in host.calls[1][1]["config"]
    assert walk.cleanup_ok and walk.destroyed and walk.egress_lease is None
