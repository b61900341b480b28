"""Clean shutdown: context exit and the CLI (SIGTERM) leave no sandbox process behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import httpx
import pytest

from provider.emulator import Emulator
from provider.emulator.bwrap import probe_runtime
from provider.emulator.hostscan import scan_host
from provider.emulator.server import OWNER_FILE, TEMP_PREFIX, owner_stamp
from tests.processes import reap

from .helpers import api, create_sandbox, data, sh, start_process

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]


async def test_context_exit_kills_everything_and_removes_state(emulator: Emulator) -> None:
    emu = Emulator(api_keys=["k"])
    async with emu:
        async with api(emu, key="k") as client:
            sandbox_id = await create_sandbox(client)
            await start_process(client, sandbox_id, "sleep 1000 & sleep 1000")
            await sh(client, sandbox_id, "nohup sleep 1000 >/dev/null 2>&1 &")
            await client.post(f"/v1/sandboxes/{await create_sandbox(client)}/pause")
        assert emu.core is not None
        data_dir = emu.core.data_dir
        assert (data_dir / "sandboxes" / sandbox_id / "fs").is_dir()
        with anyio.fail_after(10):  # 2 supervisors, the leader, 2 background sleeps
            while len(emu.leaked_host_pids()) < 5:
                await anyio.sleep(0.02)
    assert emu.leaked_host_pids() == []
    assert not data_dir.exists()


async def test_given_data_dir_is_kept_but_sandbox_state_removed(emulator: Emulator) -> None:
    parent = Path(tempfile.mkdtemp(prefix="emu-test-"))
    parent.chmod(0o755)
    try:
        emu = Emulator(api_keys=["k"], data_dir=parent / "emu")
        async with emu, api(emu, key="k") as client:
            sandbox_id = await create_sandbox(client)
            assert (parent / "emu" / "sandboxes" / sandbox_id).is_dir()
        assert (parent / "emu").is_dir()
        assert not (parent / "emu" / "sandboxes" / sandbox_id).exists()
    finally:
        shutil.rmtree(parent, ignore_errors=True)


async def test_unreachable_data_dir_is_refused(emulator: Emulator, tmp_path: Path) -> None:
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    runtime = probe_runtime()
    if runtime.drop_to_uid is None:
        pytest.skip("sandboxes run as the current user here")
    with pytest.raises(ValueError, match="not reachable"):
        async with Emulator(data_dir=hidden / "emu"):
            pass


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "provider.emulator", "--quiet", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


async def test_cli_prints_url_and_stops_cleanly_on_sigterm(emulator: Emulator) -> None:
    proc = _cli("--api-key", "cli-key", "--admin-token", "tok")
    try:
        assert proc.stdout is not None
        url = (await anyio.to_thread.run_sync(proc.stdout.readline)).strip()
        assert url.startswith("http://127.0.0.1:")
        async with httpx.AsyncClient(base_url=url, headers={"X-Api-Key": "cli-key"}) as client:
            created = await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
            sandbox_id = data(created)["id"]
            await client.post(
                f"/v1/sandboxes/{sandbox_id}/processes",
                json={"cmd": "/bin/bash", "args": ["-c", "sleep 1000 & sleep 1000"]},
            )
            with anyio.fail_after(10):  # supervisor, bash and its background sleep
                while True:
                    state = await client.get(
                        "/_emulator/state", headers={"X-Emulator-Token": "tok"}
                    )
                    pids = data(state)["sandboxes"][0]["host_pids"]
                    if len(pids) >= 3:
                        break
                    await anyio.sleep(0.02)
        namespaces = {os.readlink(f"/proc/{pids[0]}/ns/pid"): None}
        proc.send_signal(signal.SIGTERM)
        code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=30))
        assert code == 0
        assert proc.stdout.read() == ""
        assert scan_host(namespaces) == {}
        assert all(not Path(f"/proc/{pid}").exists() for pid in pids)
    finally:
        reap(proc)


async def test_cli_reads_keys_from_a_file(emulator: Emulator, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nfile-key-1\n\nfile-key-2\n")
    proc = _cli("--api-key-file", str(keys))
    try:
        assert proc.stdout is not None
        url = (await anyio.to_thread.run_sync(proc.stdout.readline)).strip()
        async with httpx.AsyncClient(base_url=url) as client:
            for key, status in (("file-key-1", 200), ("file-key-2", 200), ("# team keys", 401)):
                got = await client.get("/v1/sandboxes", headers={"X-Api-Key": key})
                assert got.status_code == status
    finally:
        proc.send_signal(signal.SIGTERM)
        await anyio.to_thread.run_sync(lambda: proc.wait(timeout=30))
        reap(proc)


async def test_cli_refuses_to_start_without_bwrap(emulator: Emulator) -> None:
    proc = _cli(env={"CREATEOS_EMULATOR_BWRAP": "/nonexistent/bwrap"})
    out, err = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=30))
    assert proc.returncode != 0
    assert out == ""
    assert "apt-get install bubblewrap" in err


async def test_temp_dirs_of_dead_emulators_are_removed_at_start(emulator: Emulator) -> None:
    stale = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    (stale / OWNER_FILE).write_text("999999999 12345")
    (stale / "sandboxes").mkdir()
    live = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    (live / OWNER_FILE).write_text(owner_stamp(os.getpid()))
    foreign = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    try:
        async with Emulator(api_keys=["k"]):
            assert not stale.exists()
            assert live.is_dir() and foreign.is_dir()
    finally:
        for path in (stale, live, foreign):
            shutil.rmtree(path, ignore_errors=True)
