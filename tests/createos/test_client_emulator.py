"""CreateOSClient and follow_process_output against the real emulator (HTTP, processes)."""

from __future__ import annotations

from typing import Any

import pytest

from provider.createos.client import CreateOSClient
from provider.createos.errors import APIConnectionError, NotFound, ServerError
from provider.createos.models import DataFrame, ExitFrame
from provider.createos.stream import follow_process_output
from provider.emulator.server import Emulator

pytestmark = pytest.mark.anyio


async def requests(emu: Emulator, method: str, suffix: str) -> list[dict[str, Any]]:
    return [
        r
        for r in await emu.admin.requests()
        if r["method"] == method and r["path"].endswith(suffix)
    ]


async def new_sandbox(api: CreateOSClient) -> str:
    return await api.create_sandbox(shape="s-1vcpu-1gb", name="pc-client", rootfs=None, region=None)


async def test_sandbox_command_file_and_process_round_trip(
    emu: Emulator, api: CreateOSClient
) -> None:
    sandbox_id = await new_sandbox(api)
    assert (await api.get_sandbox(sandbox_id)).status == "running"
    assert sandbox_id in [v.id for v in await api.list_sandboxes(status="running")]

    result = await api.exec(sandbox_id, "/bin/bash", ["-lc", "echo out; echo err >&2; exit 3"])
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)

    path = "/paperclip-workspace/dir with space/ü&=?#.bin"
    blob = bytes(range(256)) * 300
    await api.put_file(sandbox_id, path, blob)
    async with api.get_file(sandbox_id, path) as body:
        assert b"".join([chunk async for chunk in body]) == blob

    script = "printf 'a\\xe2\\x82'; printf '\\xac' ; printf warn >&2; exit 7"
    view = await api.create_process(sandbox_id, cmd="/bin/bash", args=["-lc", script])
    frames = [f async for f in follow_process_output(api, sandbox_id, view.process_id)]
    assert frames[-1] == ExitFrame(7, None)
    data = [f for f in frames if isinstance(f, DataFrame)]
    assert [f.seq for f in data] == list(range(1, len(data) + 1))
    assert b"".join(f.data for f in data if f.stream == "stdout") == "a€".encode()
    assert b"".join(f.data for f in data if f.stream == "stderr") == b"warn"
    killed = await api.delete_process(sandbox_id, view.process_id, grace_ms=100)
    assert killed.tree_exited

    assert await api.delete_sandbox(sandbox_id) in ("destroying", "destroyed")
    with pytest.raises(NotFound):
        await api.get_process(sandbox_id, "proc_unknown")


async def test_reads_are_retried_through_emulator_503s(emu: Emulator, api: CreateOSClient) -> None:
    sandbox_id = await new_sandbox(api)
    await emu.admin.add_fault("GET", f"/sandboxes/{sandbox_id}$", times=2, status=503)

    assert (await api.get_sandbox(sandbox_id)).id == sandbox_id
    assert [r["status"] for r in await requests(emu, "GET", sandbox_id)] == [503, 503, 200]


async def test_process_creation_is_sent_once_on_502(emu: Emulator, api: CreateOSClient) -> None:
    sandbox_id = await new_sandbox(api)
    await emu.admin.add_fault("POST", "/processes$", times=3, status=502)

    with pytest.raises(ServerError):
        await api.create_process(sandbox_id, cmd="/bin/true", args=[])
    assert len(await requests(emu, "POST", "/processes")) == 1


async def test_lost_create_response_is_not_repeated(emu: Emulator, api: CreateOSClient) -> None:
    await emu.admin.add_fault("POST", "/sandboxes$", times=1, lose_response=True)

    with pytest.raises(APIConnectionError):
        await new_sandbox(api)
    assert len(await requests(emu, "POST", "/v1/sandboxes")) == 1
    # The sandbox does exist: that is why create is never blindly repeated.
    assert [v.name for v in await api.list_sandboxes()] == ["pc-client"]


async def test_stream_cut_reconnects_from_the_last_seq(emu: Emulator, api: CreateOSClient) -> None:
    sandbox_id = await new_sandbox(api)
    script = "for i in 1 2 3 4 5; do echo line$i; sleep 0.05; done; exit 4"
    view = await api.create_process(sandbox_id, cmd="/bin/bash", args=["-lc", script])
    await emu.admin.add_fault("GET", "/connect$", times=1, cut_after_frames=2)

    frames = [f async for f in follow_process_output(api, sandbox_id, view.process_id)]

    connects = await requests(emu, "GET", "/connect")
    assert [r["query"] for r in connects] == ["after=0", "after=2"]
    assert frames[-1] == ExitFrame(4, None)
    stdout = b"".join(f.data for f in frames if isinstance(f, DataFrame))
    assert stdout == b"".join(b"line%d\n" % i for i in range(1, 6))
