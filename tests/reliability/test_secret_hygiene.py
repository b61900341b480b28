"""Secret hygiene (issue 8, item 5): the API key never leaves the worker in any form.

The whole flow runs through a real ``python -m provider`` process with a recognizable key: validate,
probe, acquire, realize, sync in, execute with live output, sync out, release for reuse, resume,
destroy, plus failing calls (a 401 whose body echoes the key, 503s that fail calls and poison a
lease, bad configs, a URL carrying the key). Every byte the worker wrote to stdout and stderr and
every file of its state folder is then scanned for the key, raw and encoded: zero hits.

One exception is the host's, not a leak: ``environmentValidateConfig`` echoes ``apiKey`` exactly as
received (docs/protocol.md 1.2; the host validates with the stored secret reference). The
test validates with a reference, and separately with the raw key, whose answer is checked to hold
it only at ``normalizedConfig.apiKey`` and is left out of the scan.
"""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from devtools.call_params import environment_call, lease_ref, state_files, with_lease
from devtools.stdio_host import StdioHost, WorkerCallError
from provider.emulator import BwrapUnavailable, Emulator
from provider.emulator.bwrap import probe_runtime
from tests.reliability.secret_scan import encoded_forms, find_secret

pytestmark = pytest.mark.anyio

WS = "/paperclip-workspace"


def test_the_scanner_finds_every_form() -> None:
    key = "sk-LEAKCHECK/0123+abc"
    for form, needle in encoded_forms(key).items():
        blob = b"prefix-" + needle + b"-suffix"
        assert find_secret(key, {"blob": blob}), form
    for pad in range(3):  # the key inside a larger base64 blob, at each alignment
        blob = base64.b64encode(b"x" * pad + key.encode() + b"tail")
        assert find_secret(key, {"blob": blob}), pad
    assert find_secret(key, {"clean": b"sk-LEAKCHECK/0123"}) == []


# Open, left to the emulator's owner: in whole-directory runs (2 of 2, never alone in 4) an
# unclosed 127.0.0.1 socket of this process is collected during this test. Suspected: the
# emulator's accept loop (provider/emulator/http.py) cancelled at stop with a connection task
# that never started, so its finally never closes the socket. Remove with that fix.
@pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")
async def test_no_form_of_the_key_leaves_the_worker(tmp_path: Path) -> None:
    try:
        probe_runtime()
    except BwrapUnavailable as exc:
        pytest.skip(str(exc))
    key = f"sk-LEAKCHECK/{secrets.token_hex(12)}+k"
    state_home = tmp_path / "state"
    runtime_dir = tmp_path / "runtime"
    env = {"XDG_STATE_HOME": str(state_home), "PAPERCLIP_CREATEOS_RUNTIME_DIR": str(runtime_dir)}
    emulator = Emulator(api_keys=[key])
    async with emulator, StdioHost(env=env, record=True) as host:
        excluded = await run_flow(host, emulator, key, tmp_path)
    assert emulator.leaked_host_pids() == []
    assert host.returncode == 0

    stdout = bytes(host.stdout)
    assert stdout.count(excluded) == 1
    sources = {
        "stdout": stdout.replace(excluded, b""),
        "stderr": bytes(host.stderr),
        **{f"state/{name}": data for name, data in state_files(state_home).items()},
        **{f"runtime/{name}": data for name, data in state_files(runtime_dir).items()},
        **{f"synced/{p.name}": p.read_bytes() for p in (tmp_path / "out").iterdir()},
    }
    assert any(name.startswith("state/") for name in sources)  # the journal was written
    assert len(host.messages) > 30
    assert find_secret(key, sources) == []


async def run_flow(host: StdioHost, emulator: Emulator, key: str, tmp_path: Path) -> bytes:
    """The flow; returns the raw answer line of the validate call made with the raw key."""
    admin = emulator.admin
    common = environment_call(emulator.base_url, key, reuseLease=True)
    secret_ref = {**common["config"], "apiKey": "7f9c1e0a-3b1d-4c55-9e0a-2a7d1c9b8e11"}
    validated = await host.call("environmentValidateConfig", {"config": secret_ref})
    assert validated["ok"] is True

    echoed = await host.call("environmentValidateConfig", {"config": common["config"]})
    assert echoed["normalizedConfig"]["apiKey"] == key
    excluded = next(
        raw
        for raw in bytes(host.stdout).split(b"\n")
        if raw.strip() and json.loads(raw).get("result") == echoed
    )
    assert excluded.count(key.encode()) == 1  # only normalizedConfig.apiKey

    assert (await host.call("environmentProbe", common))["ok"] is True
    run = {"runId": "run-1", "agentId": "agent-1", "executionWorkspaceId": "workspace-1"}
    lease = await host.call("environmentAcquireLease", {**common, **run})  # reusable
    await host.call("environmentRealizeWorkspace", {**with_lease(common, lease), "workspace": {}})

    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "a.txt").write_text("alpha\n")
    (tmp_path / "one.txt").write_text("one\n")
    files = [
        {"sourcePath": str(source), "targetPath": f"{WS}/tree", "kind": "directory"},
        {"sourcePath": str(tmp_path / "one.txt"), "targetPath": f"{WS}/one.txt", "kind": "file"},
    ]
    synced = await host.call(
        "environmentSyncIn",
        {**with_lease(common, lease), "operations": [{"operationId": "in", "files": files}]},
    )
    assert synced["operations"][0]["filesTransferred"] == 2

    chunks: list[tuple[str, str]] = []
    result = await host.call(
        "environmentExecute",
        {
            **with_lease(common, lease),
            "command": "bash",
            "args": ["-c", "cat tree/sub/a.txt one.txt; echo to-stderr >&2; env | sort"],
            "cwd": WS,
            "env": {"GREETING": "hello"},
        },
        on_log=lambda stream, chunk: chunks.append((stream, chunk)),
    )
    assert result["exitCode"] == 0 and result["stdout"].startswith("alpha\none\n")
    assert ("stderr", "to-stderr\n") in chunks

    (tmp_path / "out").mkdir()
    back = [{"sourcePath": f"{WS}/one.txt", "targetPath": str(tmp_path / "out" / "one.txt"),
             "kind": "file"}]  # fmt: skip
    await host.call(
        "environmentSyncOut",
        {**with_lease(common, lease), "operations": [{"operationId": "out", "files": back}]},
    )
    assert (tmp_path / "out" / "one.txt").read_text() == "one\n"

    assert (await host.call("environmentReleaseLease", lease_ref(common, lease)))["state"] == (
        "stopped"
    )
    resumed = await host.call("environmentResumeLease", lease_ref(common, lease))
    assert resumed["metadata"]["resumedLease"] is True

    await failing_calls(host, emulator, key, common, lease)
    await admin.clear_faults()
    receipt = await host.call("environmentDestroyLease", lease_ref(common, lease))
    assert receipt["state"] == "destroyed"
    assert (await admin.state())["sandboxes"] == []
    return excluded


async def expect_error(host: StdioHost, method: str, params: dict[str, Any]) -> str:
    with pytest.raises(WorkerCallError) as caught:
        await host.call(method, params)
    return str(caught.value.error.get("message"))


async def failing_calls(
    host: StdioHost, emulator: Emulator, key: str, common: dict[str, Any], lease: dict[str, Any]
) -> None:
    admin = emulator.admin
    ref = lease_ref(common, lease)
    leased = with_lease(common, lease)
    echo = {"status": "fail", "data": {"auth": f"key {key} is not valid here"}}
    await admin.add_fault("GET", r"^/v1/sandboxes/[^/]+$", status=401, body=echo)
    assert "401" in await expect_error(host, "environmentResumeLease", ref)

    busy = {"status": "error", "message": f"overloaded for {key}", "code": 503}
    await admin.add_fault("POST", r"^/v1/sandboxes$", status=503, body=busy, times=3)
    assert "503" in await expect_error(host, "environmentAcquireLease", {**common, "runId": "r"})

    # The command may have run and its kill cannot be confirmed: poisoned.
    await admin.add_fault("POST", r"/exec$", status=502, body=echo, times=2)
    assert "Destroy" in await expect_error(host, "environmentExecute", {**leased, "command": "x"})
    refused = await expect_error(host, "environmentExecute", {**leased, "command": "x"})
    assert "destroy" in refused.lower()

    await admin.add_fault("DELETE", r"^/v1/sandboxes/[^/]+$", status=503, times=3)
    assert "503" in await expect_error(host, "environmentDestroyLease", ref)

    bad_configs: list[dict[str, Any]] = [
        {**common["config"], "timeoutMs": "500"},
        {**common["config"], "apiUrl": f"https://user:{key}@api.example"},
        {**common["config"], "apiUrl": f"https://api.example/?key={key}"},
        {**common["config"], "apiKey": key + "\nX-Other: 1"},
        {**common["config"], "shape": None},
    ]
    for config in bad_configs:
        await expect_error(host, "environmentAcquireLease", {**common, "config": config})
        probe = await host.call("environmentProbe", {**common, "config": config})
        assert probe["ok"] is False
    refs = [{**config, "apiKey": "7f9c1e0a-3b1d-4c55-9e0a-2a7d1c9b8e11"} for config in bad_configs]
    for config in refs[:3] + refs[4:]:  # validation of a stored config (secret reference)
        assert (await host.call("environmentValidateConfig", {"config": config}))["ok"] is False
