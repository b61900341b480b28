"""Folder images in sandboxes: overlaid read-only at their paths, kept by forks, listed."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from devtools.emulator_process import EmulatorProcess
from provider.emulator import BwrapUnavailable
from provider.emulator.bwrap import probe_runtime

from .helpers import api, create_sandbox, data, sh, wait_status
from .image_fixtures import AGENT, TOOL, image_emulator, image_folder, tree_digest

pytestmark = pytest.mark.anyio

IMAGE = "agent-test:1"


async def test_image_tree_appears_at_its_paths_with_the_host_view_kept() -> None:
    with image_folder() as root:
        host_local = sorted(p.name for p in Path("/usr/local/bin").iterdir())
        async with image_emulator({IMAGE: root}) as emu, api(emu) as client:
            response = await client.post(
                "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": IMAGE}
            )
            view = data(response)
            assert view["rootfs"] == IMAGE
            sandbox_id = view["id"]
            assert data(await client.get(f"/v1/sandboxes/{sandbox_id}"))["rootfs"] == IMAGE
            found = await sh(client, sandbox_id, f"command -v {TOOL}; {TOOL} on path")
            assert found == {**found, "exit_code": 0}
            assert found["stdout"] == f"/usr/local/bin/{TOOL}\ntool says on path\n"
            linked = await sh(client, sandbox_id, f"{TOOL}-link; {AGENT} x; {AGENT}-link y")
            assert linked["stdout"] == "tool says \nagent 0 x\nagent 0 y\n", linked
            other = await sh(
                client,
                sandbox_id,
                "cat /opt/paperclip-image-test/VERSION "
                "/usr/share/paperclip-image-test/notes.txt; "
                "test -x /usr/bin/env && test -d /usr/share/doc && echo host-usr; "
                "ls -A /usr/local/bin",
            )
            lines = other["stdout"].splitlines()
            assert lines[:3] == ["1.2.3", "notes", "host-usr"], other
            assert sorted(lines[3:]) == sorted([*host_local, TOOL, f"{TOOL}-link"])


async def test_guest_writes_into_the_image_fail_and_the_folder_is_unchanged() -> None:
    with image_folder() as root:
        for path in [root, *root.rglob("*")]:  # only the read-only mount can stop a write
            if not path.is_symlink():
                path.chmod(0o777 if path.is_dir() else 0o666 | (path.stat().st_mode & 0o111))
        before = tree_digest(root)
        attempts = [
            f"echo x > {AGENT}",
            f"chmod 700 {AGENT}",
            "touch /opt/paperclip-image-test/new",
            "mkdir /opt/new-dir",
            f"echo x > /usr/local/bin/{TOOL}",
            f"rm -f /usr/local/bin/{TOOL}",
            f"rm -f /usr/local/bin/{TOOL}-link",
            "touch /usr/local/bin/new",
            "mkdir /usr/local/new-dir",
            "echo x > /usr/share/paperclip-image-test/notes.txt",
            "touch /usr/share/new",
        ]
        script = "id -u; " + "; ".join(f"( {a} ) 2>>/tmp/err; echo $?" for a in attempts)
        async with image_emulator({IMAGE: root}) as emu, api(emu) as client:
            sandbox_id = await create_sandbox(client, rootfs=IMAGE)
            result = await sh(client, sandbox_id, script)
            codes = result["stdout"].split()
            assert codes[0] == "0"  # guest root
            assert len(codes) == len(attempts) + 1
            assert all(code != "0" for code in codes[1:]), dict(
                zip(attempts, codes[1:], strict=True)
            )
            errors = (await sh(client, sandbox_id, "cat /tmp/err"))["stdout"]
            assert errors.count("Read-only file system") >= len(attempts) - 2, errors
            again = await sh(client, sandbox_id, f"{TOOL} still")
            assert again["stdout"] == "tool says still\n"
        assert tree_digest(root) == before


async def test_catalog_lists_the_image_and_other_rootfs_do_not_see_it() -> None:
    with image_folder() as root:
        async with image_emulator({IMAGE: root}) as emu, api(emu, key=None) as public:
            catalog = data(await public.get("/v1/rootfs"))
            assert IMAGE in catalog["rootfs"] and "devbox:1" in catalog["rootfs"]
            assert catalog["default"] == "devbox:1"
            assert {e["name"] for e in catalog["entries"]} == set(catalog["rootfs"])
            async with api(emu) as client:
                unknown = await client.post(
                    "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": "agent-test:2"}
                )
                assert unknown.status_code == 400
                assert unknown.json()["status"] == "fail" and "rootfs" in unknown.json()["data"]
                plain = await create_sandbox(client)
                result = await sh(client, plain, f"command -v {TOOL}; ls /opt")
                assert result["stdout"] == "" and result["exit_code"] != 0


async def test_fork_keeps_the_image() -> None:
    with image_folder() as root:
        async with image_emulator({IMAGE: root}) as emu, api(emu) as client:
            await emu.admin.settings(pause_delay_ms=0, fork_busy_ms=0)
            source = await create_sandbox(client, rootfs=IMAGE)
            await client.post(f"/v1/sandboxes/{source}/pause")
            await wait_status(client, source, "paused")
            forked = data(await client.post(f"/v1/sandboxes/{source}/fork", json={}))
            assert forked["rootfs"] == IMAGE
            view = await wait_status(client, forked["id"], "running")
            assert view["rootfs"] == IMAGE and view["forked_from"] == source
            result = await sh(client, forked["id"], f"{TOOL} forked; {AGENT}")
            assert result["stdout"] == "tool says forked\nagent 0 \n"


async def test_an_image_can_override_the_default_rootfs() -> None:
    with image_folder() as root:
        async with image_emulator({"devbox:1": root}) as emu, api(emu) as client:
            catalog = data(await client.get("/v1/rootfs"))
            assert catalog["rootfs"].count("devbox:1") == 1
            entry = next(e for e in catalog["entries"] if e["name"] == "devbox:1")
            assert "local folder" in entry["description"]
            sandbox_id = await create_sandbox(client)  # no rootfs: the default
            assert (await sh(client, sandbox_id, f"{TOOL} default"))["stdout"] == (
                "tool says default\n"
            )
            other = await create_sandbox(client, rootfs="debian:13")
            assert (await sh(client, other, f"command -v {TOOL}"))["exit_code"] != 0


async def test_emulator_process_passes_image_flags() -> None:
    try:
        await anyio.to_thread.run_sync(probe_runtime)
    except BwrapUnavailable as exc:
        pytest.skip(str(exc))
    with image_folder() as root, tempfile.TemporaryDirectory(prefix="createos-img-") as top:
        Path(top).chmod(0o755)  # the data dir must be reachable by the guest uid
        emu = EmulatorProcess(Path(top) / "emu", "proc-key", images={IMAGE: root})
        async with emu, api_at(emu) as client:
            assert IMAGE in data(await client.get("/v1/rootfs"))["rootfs"]
            created = await client.post(
                "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": IMAGE}
            )
            sandbox_id = data(created)["id"]
            assert (await sh(client, sandbox_id, TOOL))["stdout"] == "tool says \n"
        assert emu.leftover_pids == []


@asynccontextmanager
async def api_at(emu: EmulatorProcess) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``emu`` (its URL is known only once it has started)."""
    headers = {"X-Api-Key": "proc-key"}
    async with httpx.AsyncClient(base_url=emu.base_url, headers=headers, timeout=30) as client:
        yield client


async def test_an_image_broken_after_start_fails_create_with_the_reason() -> None:
    with image_folder() as root:
        async with image_emulator({IMAGE: root}) as emu, api(emu) as client:
            os.mkfifo(root / "pipe")  # unmountable, added after the start-up check
            response = await client.post(
                "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": IMAGE}
            )
            assert response.status_code == 503
            assert "pipe is not a file, directory or symlink" in response.json()["message"]
            (root / "pipe").unlink()
            assert (await sh(client, await create_sandbox(client, rootfs=IMAGE), TOOL))[
                "exit_code"
            ] == 0
