"""Conformance against the REAL Paperclip worker manager (@paperclipai/server 2026.916.1).

The peer is installed from npm into a cache folder on first use (host/install-peer.sh); these
tests are part of the normal suite and run in CI. They fail (never skip) when Node is missing.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devtools.call_params import common_params, validate_params
from devtools.host_peer import REPO_ROOT, HostPeer
from devtools.peer_sessions import PeerCallError
from devtools.procfs import pid_alive, wait_until_gone
from provider.app import build_dispatcher
from provider.rpc import wire
from tests.host.peer_helpers import package_copy, streaming_package

pytestmark = [pytest.mark.anyio, pytest.mark.host]

ENVIRONMENT_VERBS = (
    "environmentValidateConfig",
    "environmentProbe",
    "environmentAcquireLease",
    "environmentResumeLease",
    "environmentReleaseLease",
    "environmentDestroyLease",
    "environmentRealizeWorkspace",
    "environmentExecute",
    "environmentSyncIn",
    "environmentSyncOut",
)
SETUP_VERBS = (  # listed before the flags are declared: the host gates on both (10.1)
    "environmentStartInteractiveSetup",
    "environmentGetInteractiveSetup",
    "environmentCaptureTemplate",
    "environmentCancelInteractiveSetup",
    "environmentDeleteTemplate",
)
INTERACTIVE_VERBS = (
    "loginPtyOpen",
    "loginPtyInput",
    "loginPtyStop",
    "loginPtyClose",
    "duplexChannelOpen",
    "duplexChannelWrite",
    "duplexChannelStop",
    "duplexChannelClose",
)
#: The driver declarations of interactive setup and templates that manifest.json declares.
TEMPLATE_FLAGS = {
    "supportsInteractiveSetup": True,
    "interactiveSetupConnectionTypes": ["createos_shell"],
    "supportsTemplateCapture": True,
    "templateRefKind": "snapshot",
    "templateConfigBinding": {"field": "snapshot", "unsetFields": ["rootfs", "rootfsByAdapter"]},
    "templateIdentityPaths": ["apiUrl"],
    "supportsTemplateDelete": True,
}
EXIT_GUARD_S = 15.0  # the manager's own stop escalation is bounded by 10 s + 0.5 s + 5 s


@pytest.fixture
async def peer(tmp_path: Path) -> AsyncIterator[HostPeer]:
    async with HostPeer(log_file=tmp_path / "peer.log", cwd=tmp_path) as running:
        yield running


async def test_the_host_loads_our_package_starts_serves_and_stops_the_worker(
    peer: HostPeer, tmp_path: Path
) -> None:
    info = await peer.start_worker()
    assert info.manifest_id == "paperclip.createos-sandbox-provider"
    assert info.entrypoint_path == str(REPO_ROOT / "shim.mjs")
    expected = list(build_dispatcher().supported_methods)
    assert info.supported_methods == expected
    assert "environmentValidateConfig" in expected
    known = (*ENVIRONMENT_VERBS, *SETUP_VERBS, *INTERACTIVE_VERBS)
    assert expected == [verb for verb in known if verb in expected]

    shim_pid = peer.shim_pid()
    worker_pid = peer.worker_pid()
    assert shim_pid is not None
    assert worker_pid is not None
    assert pid_alive(shim_pid)
    assert pid_alive(worker_pid)

    assert await peer.call("health", {}) == {"status": "ok"}
    valid = await peer.call(
        "environmentValidateConfig",
        validate_params(
            {
                "apiUrl": "http://127.0.0.1:8790/v1",
                "apiKey": "emu-key",
                "shape": "s-1vcpu-1gb",
                "reuseLease": False,
            }
        ),
    )
    assert valid["ok"] is True
    assert valid["normalizedConfig"]["apiUrl"] == "http://127.0.0.1:8790"
    assert valid["normalizedConfig"]["timeoutMs"] == 300_000
    bad_timeout = {"shape": "s-1vcpu-1gb", "timeoutMs": "500"}
    invalid = await peer.call("environmentValidateConfig", validate_params(bad_timeout))
    assert invalid["ok"] is False
    assert invalid["errors"][0].startswith("timeoutMs")
    assert await peer.call("configChanged", {"config": {}, "companyId": None}) is None

    with pytest.raises(PeerCallError) as unknown:
        await peer.call("noSuchMethod", {})
    assert unknown.value.code == wire.METHOD_NOT_FOUND
    with pytest.raises(PeerCallError) as hook:
        await peer.call("validateConfig", {"config": {}})
    assert hook.value.code == wire.METHOD_NOT_IMPLEMENTED

    await peer.stop_worker()
    assert await wait_until_gone(worker_pid, EXIT_GUARD_S)
    assert await wait_until_gone(shim_pid, EXIT_GUARD_S)
    exits = [e for e in peer.events if e.type == "exit"]
    assert exits
    assert exits[-1].raw.get("code") == 0
    assert not [e for e in peer.events if e.type == "crash"]

    log = (tmp_path / "peer.log").read_text()
    assert "unparseable message from worker" not in log
    assert "unknown message type from worker" not in log


async def test_sigkill_of_the_shim_takes_the_python_worker_down_within_a_second(
    peer: HostPeer,
) -> None:
    # Two things end the worker here: PR_SET_PDEATHSIG (SIGTERM) and the stdin EOF that Node
    # produces when it reaps the shim. tests/rpc/test_process.py isolates the first one.
    await peer.start_worker(auto_restart=False)
    shim_pid = peer.shim_pid()
    worker_pid = peer.worker_pid()
    assert shim_pid is not None
    assert worker_pid is not None
    os.kill(shim_pid, signal.SIGKILL)
    assert await wait_until_gone(worker_pid, 1.0)


async def test_a_crashed_worker_is_restarted_and_initialized_again(peer: HostPeer) -> None:
    await peer.start_worker()
    first_worker = peer.worker_pid()
    assert first_worker is not None
    seen = len(peer.events)
    os.kill(first_worker, signal.SIGKILL)  # the shim re-raises it: the host sees a crash
    crash = await peer.wait_for_event("crash", after=seen, timeout_s=EXIT_GUARD_S)
    assert crash.raw.get("signal") == "SIGKILL"
    await peer.wait_for_event("ready", after=seen, timeout_s=EXIT_GUARD_S)
    assert await peer.call("health", {}) == {"status": "ok"}
    second_worker = peer.worker_pid()
    assert second_worker is not None
    assert second_worker != first_worker
    await peer.stop_worker()
    assert await wait_until_gone(second_worker, EXIT_GUARD_S)


async def test_requests_far_above_64_kib_cross_the_real_host(peer: HostPeer) -> None:
    await peer.start_worker()
    config = {"shape": "s-1vcpu-1gb", "archiveOnRelease": "x" * (2 * 1024 * 1024)}
    result = await peer.call("environmentValidateConfig", validate_params(config))
    assert result["ok"] is True
    await peer.stop_worker()


async def test_a_broken_manifest_module_fails_like_on_the_host(
    peer: HostPeer, tmp_path: Path
) -> None:
    root = package_copy(tmp_path)
    (root / "manifest.js").write_text("export default {{ this is not javascript\n")
    with pytest.raises(PeerCallError, match="Failed to load manifest module"):
        await peer.start_worker(package_root=root)


async def test_an_unknown_driver_key_fails_the_hosts_manifest_validation(
    peer: HostPeer, tmp_path: Path
) -> None:
    root = package_copy(tmp_path)
    manifest = (root / "manifest.json").read_text()
    (root / "manifest.json").write_text(
        manifest.replace('"kind": "sandbox_provider",', '"kind": "sandbox_provider", "ttl": 1,')
    )
    with pytest.raises(PeerCallError):
        await peer.start_worker(package_root=root)


async def test_the_template_flags_to_declare_pass_the_hosts_manifest_validation(
    peer: HostPeer, tmp_path: Path
) -> None:
    """The interactive-setup and template declarations (docs/protocol.md H10.1): the real host
    accepts them, and the worker serves their verbs."""
    root = package_copy(tmp_path)
    manifest = json.loads((root / "manifest.json").read_text())
    (driver,) = manifest["environmentDrivers"]
    # whatever is declared already agrees with what is declared here
    assert {key: driver.get(key, value) for key, value in TEMPLATE_FLAGS.items()} == TEMPLATE_FLAGS
    driver.update(TEMPLATE_FLAGS)
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    info = await peer.start_worker(package_root=root)
    assert set(SETUP_VERBS) <= set(info.supported_methods)
    await peer.stop_worker()


async def test_a_package_copy_elsewhere_runs_its_own_shim(peer: HostPeer, tmp_path: Path) -> None:
    root = package_copy(tmp_path)
    info = await peer.start_worker(package_root=root)
    assert info.entrypoint_path == str(root / "shim.mjs")
    assert await peer.call("health", {}) == {"status": "ok"}
    await peer.stop_worker()


async def test_sigterm_to_the_shim_is_forwarded_and_the_worker_exits_cleanly(
    peer: HostPeer,
) -> None:
    await peer.start_worker(auto_restart=False)
    shim_pid = peer.shim_pid()
    worker_pid = peer.worker_pid()
    assert shim_pid is not None
    assert worker_pid is not None
    seen = len(peer.events)
    os.kill(shim_pid, signal.SIGTERM)  # what the host's stop escalation sends
    exit_event = await peer.wait_for_event("exit", after=seen, timeout_s=EXIT_GUARD_S)
    assert exit_event.raw.get("code") == 0  # the worker's clean exit, passed on by the shim
    assert exit_event.raw.get("signal") is None
    assert await wait_until_gone(worker_pid, EXIT_GUARD_S)


async def test_live_output_reaches_the_host_tagged_with_the_invocation_id(
    peer: HostPeer, tmp_path: Path
) -> None:
    root = streaming_package(tmp_path)
    await peer.start_worker(package_root=root)
    live: list[tuple[str, str]] = []
    params = {
        **common_params({}, company_id="company-1", environment_id="env-1"),
        "lease": {"providerLeaseId": "sb_1", "metadata": {}},
        "command": "echo",
        "chunks": ["one\n", "two ✓\n"],
    }
    result = await peer.call(
        "environmentExecute", params, on_log=lambda stream, chunk: live.append((stream, chunk))
    )
    # The host only forwards execute.log whose paperclipInvocationId names this open call.
    assert live == [("stdout", "one\n"), ("stdout", "two ✓\n"), ("stderr", "warn\n")]
    assert result["stdout"] == "one\ntwo ✓\n"
    assert isinstance(result["metadata"]["invocationId"], str)
    await peer.stop_worker()


async def test_a_lone_surrogate_from_the_host_is_answered_at_once_under_its_call(
    peer: HostPeer,
) -> None:
    """A JS string holding half an emoji crosses the real manager as a lone surrogate escape:
    the call is answered (a refusal naming the param), not left to the host's timeout."""
    await peer.start_worker()
    config = {"shape": "s-1vcpu-1gb", "apiKey": "emu-key\ud83d"}
    with pytest.raises(PeerCallError) as refused:
        await peer.call(
            "environmentValidateConfig",
            validate_params(config),
            timeout_ms=15_000,
        )
    assert refused.value.code == wire.INVALID_PARAMS, refused.value
    assert "params.config.apiKey holds a lone UTF-16 surrogate" in str(refused.value)
    await peer.stop_worker()
