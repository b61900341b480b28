"""The core path through real HTTP: create, exec, files, a managed process, delete."""

from __future__ import annotations

import pytest

from provider.emulator import Emulator

from .helpers import api, create_sandbox, data, payload, read_frames, sh, start_process

pytestmark = pytest.mark.anyio


async def test_create_exec_files_process_delete(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        assert sandbox_id.startswith("sb_") and len(sandbox_id) == 29

        result = await sh(client, sandbox_id, "echo hi; echo oops >&2; exit 3")
        assert result == {"stdout": "hi\n", "stderr": "oops\n", "exit_code": 3}

        put = await client.put(
            f"/v1/sandboxes/{sandbox_id}/files",
            params={"path": "/paperclip-workspace/deep/dir/a.txt"},
            content=b"hello",
        )
        assert put.status_code == 200
        assert data(put) == {"bytes": 5, "path": "/paperclip-workspace/deep/dir/a.txt"}
        got = await client.get(
            f"/v1/sandboxes/{sandbox_id}/files",
            params={"path": "/paperclip-workspace/deep/dir/a.txt"},
        )
        assert got.status_code == 200 and got.content == b"hello"

        proc = await start_process(client, sandbox_id, "echo out; echo err >&2; exit 7")
        assert proc["process_id"].startswith("proc_") and proc["state"] == "running"
        frames = await read_frames(client, sandbox_id, proc["process_id"])
        assert frames[-1] == {"type": "exit", "exit_code": 7}
        assert [f["seq"] for f in frames if f["type"] == "data"] == list(range(1, len(frames)))
        assert payload(frames, "stdout") == b"out\n"
        assert payload(frames, "stderr") == b"err\n"

        deleted = await client.delete(f"/v1/sandboxes/{sandbox_id}")
        assert deleted.status_code == 200
        assert data(deleted)["status"] in ("destroying", "destroyed")
        state = await emulator.admin.state()
        assert state["sandboxes"] == []
        assert await emulator.admin.live_process_count() == 0
