"""Files API: round trips, chunked and empty bodies, limits, and path confinement."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from provider.emulator import Emulator

from .helpers import KEY, api, create_sandbox, data, sh

pytestmark = pytest.mark.anyio


async def test_put_get_roundtrip_overwrite_and_empty(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        url = f"/v1/sandboxes/{sandbox_id}/files"
        blob = os.urandom(3 * 1024 * 1024 + 17)
        put = await client.put(url, params={"path": "/tmp/a/b/blob.bin"}, content=blob)
        assert data(put) == {"bytes": len(blob), "path": "/tmp/a/b/blob.bin"}
        got = await client.get(url, params={"path": "/tmp/a/b/blob.bin"})
        assert got.headers["content-type"] == "application/octet-stream"
        assert got.content == blob
        await client.put(url, params={"path": "/tmp/a/b/blob.bin"}, content=b"short")
        assert (await client.get(url, params={"path": "/tmp/a/b/blob.bin"})).content == b"short"
        empty = await client.put(
            url, params={"path": "/root/.paperclip-runtime/empty"}, content=b""
        )
        assert data(empty)["bytes"] == 0
        got_empty = await client.get(url, params={"path": "/root/.paperclip-runtime/empty"})
        assert got_empty.status_code == 200 and got_empty.content == b""
        listing = await sh(client, sandbox_id, "ls -A /tmp/a/b; stat -c %s /tmp/a/b/blob.bin")
        assert listing["stdout"] == "blob.bin\n5\n"


async def test_chunked_upload_and_names_needing_quoting(emulator: Emulator) -> None:
    async def body() -> AsyncIterator[bytes]:
        for i in range(20):
            yield bytes([i]) * 70_000

    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        url = f"/v1/sandboxes/{sandbox_id}/files"
        path = "/paperclip-workspace/dir with space/ünï & co?.txt"
        put = await client.put(url, params={"path": path}, content=body())
        assert data(put)["bytes"] == 20 * 70_000
        got = await client.get(url, params={"path": path})
        assert got.content == b"".join(bytes([i]) * 70_000 for i in range(20))


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "relative/path", 400),
        ("PUT", "relative/path", 400),
        ("GET", "/paperclip-workspace/missing", 404),
        ("GET", "/paperclip-workspace", 400),
        ("GET", "/tmp/adir", 400),
        ("PUT", "/tmp/adir", 400),
        ("GET", "/etc/passwd", 400),
        ("PUT", "/etc/evil", 400),
        ("PUT", "/usr/bin/evil", 400),
        ("GET", "/paperclip-workspace/../etc/passwd", 400),
        ("PUT", "/paperclip-workspace/../../root/../etc/x", 400),
        ("GET", "/paperclip-workspace/link-passwd", 400),
        ("PUT", "/paperclip-workspace/link-passwd", 400),
        ("GET", "/paperclip-workspace/link-etc/passwd", 400),
        ("PUT", "/paperclip-workspace/link-etc/x", 400),
        ("GET", "/paperclip-workspace/link-up/etc/passwd", 400),
        ("GET", "/paperclip-workspace/afile/child", 404),
        ("PUT", "/paperclip-workspace/afile/child", 400),
        ("GET", "/proc/self/environ", 400),
    ],
)
async def test_path_rules(emulator: Emulator, method: str, path: str, status: int) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        await sh(
            client,
            sandbox_id,
            "mkdir /tmp/adir; cd /paperclip-workspace; ln -s /etc/passwd link-passwd; "
            "ln -s /etc link-etc; ln -s ../.. link-up; echo x > afile",
        )
        url = f"/v1/sandboxes/{sandbox_id}/files"
        response = await client.request(method, url, params={"path": path}, content=b"pwned")
        assert response.status_code == status, response.text
        assert response.json()["status"] == "fail"
        assert b"root:x:0:0" not in response.content


async def test_symlinks_inside_the_trees_are_followed(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        await sh(client, sandbox_id, "echo target > /tmp/real; ln -s /tmp/real /root/alias")
        url = f"/v1/sandboxes/{sandbox_id}/files"
        assert (await client.get(url, params={"path": "/root/alias"})).content == b"target\n"


async def test_missing_path_param_and_size_limit(emulator: Emulator) -> None:
    await emulator.admin.settings(max_file_bytes=1000)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        url = f"/v1/sandboxes/{sandbox_id}/files"
        assert (await client.get(url)).status_code == 400
        assert (
            await client.put(url, params={"path": "/tmp/ok"}, content=b"x" * 1000)
        ).status_code == 200
        too_big = await client.put(url, params={"path": "/tmp/big"}, content=b"x" * 1001)
        assert too_big.status_code == 413

        async def chunked() -> AsyncIterator[bytes]:
            for _ in range(3):
                yield b"y" * 600

        chunked_big = await client.put(url, params={"path": "/tmp/big2"}, content=chunked())
        assert chunked_big.status_code == 413
        leftovers = await sh(client, sandbox_id, "ls -A /tmp")
        assert leftovers["stdout"] == "ok\n"


async def test_sandboxes_do_not_see_each_other_or_the_host(emulator: Emulator) -> None:
    async with api(emulator) as client:
        first = await create_sandbox(client)
        second = await create_sandbox(client)
        await client.put(
            f"/v1/sandboxes/{first}/files",
            params={"path": "/paperclip-workspace/mine"},
            content=b"1",
        )
        other_view = await client.get(
            f"/v1/sandboxes/{second}/files", params={"path": "/paperclip-workspace/mine"}
        )
        assert other_view.status_code == 404
        await sh(client, first, "sleep 300 & echo started")
        processes = await sh(client, second, "ps -eo args")
        assert "sleep 300" not in processes["stdout"]
        host_home = await sh(client, second, "ls /home /work /old_root 2>&1; ls -A /root")
        assert "No such file" in host_home["stdout"] and "createos" not in host_home["stdout"]
        write_usr = await sh(client, second, "touch /usr/x 2>&1; echo $?")
        assert write_usr["stdout"].strip().endswith("1")
    assert not Path("/paperclip-workspace").exists()


async def test_unshare_net_leaves_only_loopback(emulator: Emulator) -> None:
    emu = Emulator(api_keys=["k"], unshare_net=True)
    async with emu, api(emu, key="k") as client:
        sandbox_id = await create_sandbox(client)
        result = await sh(client, sandbox_id, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert result["stdout"].split() == ["lo"]


async def test_an_upload_cut_mid_body_writes_nothing_and_the_server_keeps_serving(
    emulator: Emulator,
) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        host, port = emulator.base_url.removeprefix("http://").rsplit(":", 1)
        target = f"/v1/sandboxes/{sandbox_id}/files?path=/tmp/cut.bin"
        head = (
            f"PUT {target} HTTP/1.1\r\nHost: {host}\r\nX-Api-Key: {KEY}\r\n"
            "Content-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\n"
        ).encode()
        async with await anyio.connect_tcp(host, int(port)) as raw:
            await raw.send(head + b"x" * 1000)  # a tenth of the promised body, then hang up
        for _ in range(3):  # the cut request's connection is gone; new ones are served
            got = await client.get(
                f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/tmp/cut.bin"}
            )
            assert got.status_code == 404
        listing = await sh(client, sandbox_id, "ls -A /tmp")
        assert "cut.bin" not in listing["stdout"]
