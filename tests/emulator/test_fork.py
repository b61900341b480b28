"""Fork (checklist 89): a paused source's workspace, /tmp and home trees copied byte-exact
(modes, symlinks, empty files), settings carried over, no processes, ``start_paused``, egress
inheritance with the network mode that follows, and 409 unless the source is paused."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from provider.emulator import Emulator
from tests.waiting import wait_until

from .helpers import (
    OPEN_NETWORK,
    api,
    create_sandbox,
    data,
    host_listener,
    network_mode,
    reaches_host,
    sh,
    start_process,
    wait_status,
)

pytestmark = pytest.mark.anyio

POPULATE = r"""
set -e
cd /paperclip-workspace
mkdir -p src/deep empty-dir private
printf 'print("hi")\n' > src/main.py
printf '#!/bin/sh\necho tool\n' > tool.sh && chmod 0755 tool.sh
: > empty.txt
printf 'secret\n' > private/key && chmod 0600 private/key && chmod 0700 private
head -c 4096 /dev/urandom > src/deep/blob.bin && chmod 0640 src/deep/blob.bin
printf '\000\001\377 no newline' > binary
ln -s src/main.py rel-link
ln -s /paperclip-workspace/tool.sh abs-link
ln -s does/not/exist dangling
ln tool.sh hard-link
chmod 0751 src
printf 'temp\n' > /tmp/t.txt && chmod 0604 /tmp/t.txt
mkdir -p /tmp/cache/a && : > /tmp/cache/a/empty
ln -s /tmp/t.txt /tmp/t-link
printf 'export FOO=1\n' > /root/.bashrc
mkdir -p /root/.config/tool && printf '{"k": 1}' > /root/.config/tool/config.json
chmod 0700 /root/.config
printf '#!/bin/sh\necho agent\n' > /root/.local/bin/agent && chmod 0755 /root/.local/bin/agent
ln -s .config/tool/config.json /root/cfg
"""
SNAPSHOT = r"""
cd /
find paperclip-workspace tmp root -mindepth 1 -printf '%p %y %m %u:%g %s %l %n\n' | LC_ALL=C sort
find paperclip-workspace tmp root -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
"""


async def _paused_source(client: httpx.AsyncClient, **fields: Any) -> str:
    source = await create_sandbox(client, **fields)
    await client.post(f"/v1/sandboxes/{source}/pause")
    await wait_status(client, source, "paused")
    return source


async def _fork(client: httpx.AsyncClient, source: str, **body: Any) -> dict[str, Any]:
    response = await client.post(f"/v1/sandboxes/{source}/fork", json=body)
    assert response.status_code == 200, response.text
    view = dict(data(response))
    assert view["status"] == "forking" and view["forked_from"] == source
    return view


async def test_checklist_89_fork_copies_the_trees_exactly(emulator: Emulator) -> None:
    await emulator.admin.settings(pause_delay_ms=0)
    async with api(emulator) as client:
        source = await create_sandbox(
            client,
            shape="s-2vcpu-4gb",
            rootfs="debian:13",
            envs={"A": "1", "B": "source"},
            auto_pause_after_seconds=600,
            ingress_enabled=True,
        )
        populated = await sh(client, source, POPULATE)
        assert populated["exit_code"] == 0, populated
        before = await sh(client, source, SNAPSHOT)
        assert "paperclip-workspace/dangling l 777" in before["stdout"]
        await start_process(client, source, "sleep 1000")
        await client.post(f"/v1/sandboxes/{source}/pause")
        await wait_status(client, source, "paused")

        forked = await _fork(client, source, envs={"B": "fork", "C": "3"})
        view = await wait_status(client, forked["id"], "running")
        source_view = data(await client.get(f"/v1/sandboxes/{source}"))
        for key in ("shape", "vcpu", "mem_mib", "disk_mib", "rootfs", "region"):
            assert view[key] == source_view[key], key
        assert view["rootfs"] == "debian:13" and view["shape"] == "s-2vcpu-4gb"
        assert view["auto_pause_after_seconds"] == 600 and view["ingress_enabled"] is True
        assert view["envs"] == ["A", "B", "C"] and view["forked_from"] == source
        assert view["name"] != source_view["name"]
        after = await sh(client, forked["id"], SNAPSHOT)
        assert after["stdout"] == before["stdout"]
        env = await sh(client, forked["id"], 'echo "$A $B $C"')
        assert env["stdout"] == "1 fork 3\n"
        # No processes carried over.
        assert data(await client.get(f"/v1/sandboxes/{forked['id']}/processes")) == {
            "processes": []
        }
        ps = await sh(client, forked["id"], "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        assert "sleep 1000" not in ps["stdout"]
        tool = await sh(client, forked["id"], "/paperclip-workspace/abs-link; bash -lc agent")
        assert tool["stdout"] == "tool\nagent\n"

        # The source stays paused; the copies are independent; deleting the source leaves
        # the child alone.
        assert data(await client.get(f"/v1/sandboxes/{source}"))["status"] == "paused"
        await sh(client, forked["id"], "echo changed > /paperclip-workspace/src/main.py")
        deleted = await client.delete(f"/v1/sandboxes/{source}")
        assert data(deleted)["status"] == "destroyed"
        assert emulator.core is not None
        gone = emulator.core.data_dir / "sandboxes" / source
        await wait_until(lambda: not gone.exists())  # the source's files are all removed
        again = await sh(client, forked["id"], "cat /paperclip-workspace/src/main.py /tmp/t.txt")
        assert again["stdout"] == "changed\ntemp\n"


async def test_start_paused_and_fork_of_a_fork(emulator: Emulator) -> None:
    await emulator.admin.settings(pause_delay_ms=0, resume_delay_ms=0)
    async with api(emulator) as client:
        source = await create_sandbox(client)
        await sh(client, source, "echo one > /root/f")
        await client.post(f"/v1/sandboxes/{source}/pause")
        await wait_status(client, source, "paused")
        child = await _fork(client, source, start_paused=True)
        seen = set()
        with anyio.fail_after(20):
            while (status := data(await client.get(f"/v1/sandboxes/{child['id']}"))["status"]) != (
                "paused"
            ):
                seen.add(status)
                await anyio.sleep(0.01)
        assert seen <= {"forking"}
        grandchild = await _fork(client, child["id"])
        await wait_status(client, grandchild["id"], "running")
        assert (await sh(client, grandchild["id"], "cat /root/f"))["stdout"] == "one\n"
        await client.post(f"/v1/sandboxes/{child['id']}/resume")
        await wait_status(client, child["id"], "running")
        assert (await sh(client, child["id"], "cat /root/f"))["stdout"] == "one\n"


async def test_fork_needs_a_paused_source(emulator: Emulator) -> None:
    await emulator.admin.settings(pause_delay_ms=5000)
    async with api(emulator) as client:
        source = await create_sandbox(client)
        running = await client.post(f"/v1/sandboxes/{source}/fork", json={})
        assert running.status_code == 409 and running.json()["status"] == "fail"
        await client.post(f"/v1/sandboxes/{source}/pause")
        assert data(await client.get(f"/v1/sandboxes/{source}"))["status"] == "pausing"
        pausing = await client.post(f"/v1/sandboxes/{source}/fork", json={})
        assert pausing.status_code == 409
        await emulator.admin.force_state(source, "error")
        assert (await client.post(f"/v1/sandboxes/{source}/fork")).status_code == 409
        async with api(emulator, key="other-key") as other:
            assert (await other.post(f"/v1/sandboxes/{source}/fork")).status_code == 404
        assert len((await emulator.admin.state())["sandboxes"]) == 1


async def test_fork_egress_inheritance_and_network_mode(emulator: Emulator) -> None:
    await emulator.admin.settings(pause_delay_ms=0)
    async with api(emulator) as client, host_listener() as port:
        restricted = await _paused_source(client, egress=["Example.com"])
        open_source = await _paused_source(client)
        cases: list[tuple[str, dict[str, Any], list[str], str]] = [
            (restricted, {}, ["example.com"], "loopback-only"),
            (restricted, {"egress": []}, ["example.com"], "loopback-only"),
            (restricted, {"egress": None}, ["example.com"], "loopback-only"),
            (restricted, {"egress": ["*"]}, ["*"], OPEN_NETWORK),
            (restricted, {"egress": ["API.github.com"]}, ["api.github.com"], "loopback-only"),
            (open_source, {}, [], OPEN_NETWORK),
            (open_source, {"egress": ["example.com"]}, ["example.com"], "loopback-only"),
        ]
        for source, body, egress, mode in cases:
            forked = await _fork(client, source, **body)
            assert forked["egress"] == egress, body
            await wait_status(client, forked["id"], "running")
            got = data(await client.get(f"/v1/sandboxes/{forked['id']}/egress"))
            assert got["egress"] == egress
            assert await network_mode(emulator, forked["id"]) == mode
            assert await reaches_host(client, forked["id"], port) is (mode == OPEN_NETWORK), body
            await client.delete(f"/v1/sandboxes/{forked['id']}")
        # A restricted fork stays restricted across its own pause, resume and fork.
        child = await _fork(client, restricted)
        await wait_status(client, child["id"], "running")
        await client.post(f"/v1/sandboxes/{child['id']}/pause")
        await wait_status(client, child["id"], "paused")
        grandchild = await _fork(client, child["id"], egress=[])
        await client.post(f"/v1/sandboxes/{child['id']}/resume")
        for sandbox_id in (child["id"], grandchild["id"]):
            await wait_status(client, sandbox_id, "running")
            assert not await reaches_host(client, sandbox_id, port)


async def test_deleting_the_source_right_after_fork_leaves_the_child_whole(
    emulator: Emulator,
) -> None:
    await emulator.admin.settings(pause_delay_ms=0, resume_delay_ms=0)
    async with api(emulator) as client:
        source = await create_sandbox(client)
        made = await sh(
            client,
            source,
            "for i in $(seq 200); do head -c 20000 /dev/urandom > /paperclip-workspace/f$i; "
            "done; cat /paperclip-workspace/f* | sha256sum",
        )
        await client.post(f"/v1/sandboxes/{source}/pause")
        await wait_status(client, source, "paused")
        child = await _fork(client, source)
        await client.delete(f"/v1/sandboxes/{source}")
        await wait_status(client, child["id"], "running")
        copied = await sh(client, child["id"], "cat /paperclip-workspace/f* | sha256sum")
        assert copied["stdout"] == made["stdout"]


async def test_resuming_the_source_right_after_fork_does_not_change_the_copy(
    emulator: Emulator,
) -> None:
    await emulator.admin.settings(pause_delay_ms=0, resume_delay_ms=0)
    async with api(emulator) as client:
        source = await create_sandbox(client)
        await sh(
            client,
            source,
            "for i in $(seq 200); do head -c 20000 /dev/urandom > /paperclip-workspace/f$i; done",
        )
        # Frozen inside its sleep, which runs out while paused: thawed, it empties every file
        # at once. The resume waits for the fork's copy, so the child has them whole.
        await start_process(
            client, source, "sleep 0.3; for f in /paperclip-workspace/f*; do : > $f; done"
        )
        await client.post(f"/v1/sandboxes/{source}/pause")
        await wait_status(client, source, "paused")
        await anyio.sleep(0.5)  # the test: the sleep runs out while the source is frozen
        child = await _fork(client, source)
        await client.post(f"/v1/sandboxes/{source}/resume")
        await wait_status(client, child["id"], "running")
        await wait_status(client, source, "running")
        sizes = await sh(client, child["id"], "cat /paperclip-workspace/f* | wc -c")
        assert int(sizes["stdout"]) == 200 * 20000
        with anyio.fail_after(10):
            while (await sh(client, source, "cat /paperclip-workspace/f* | wc -c"))["stdout"] != (
                "0\n"
            ):
                await anyio.sleep(0.05)
