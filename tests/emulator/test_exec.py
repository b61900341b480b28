"""One-shot exec: buffered and streamed, env rules, stdin, spawn failures."""

from __future__ import annotations

import json

import pytest

from provider.emulator import Emulator

from .helpers import api, create_sandbox, data

pytestmark = pytest.mark.anyio


async def test_exec_runs_without_a_shell_from_home(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        response = await client.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "echo", "args": ["$HOME", "a b"]}
        )
        body = data(response)
        assert body["result"] == {"stdout": "$HOME a b\n", "stderr": "", "exit_code": 0}
        assert isinstance(body["exec_ms"], float)
        pwd = data(await client.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "pwd"}))
        assert pwd["result"]["stdout"] == "/root\n"


async def test_exec_stdin_and_invalid_utf8(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        response = await client.post(
            f"/v1/sandboxes/{sandbox_id}/exec",
            json={
                "cmd": "/bin/bash",
                "args": ["-c", "tr a-z A-Z; printf '\\xff' >&2"],
                "stdin": "héllo",
            },
        )
        result = data(response)["result"]
        assert result["stdout"] == "HéLLO"
        assert result["stderr"] == "\ufffd"


async def test_exec_spawn_failure_sets_error(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        response = await client.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "/no/such/binary"}
        )
        assert response.status_code == 200
        result = data(response)["result"]
        assert result["exit_code"] == -1 and result["error"]
        missing = await client.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"args": ["x"]})
        assert missing.status_code == 400


async def test_exec_env_only_declared_keys(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client, envs={"DECLARED": "base", "OTHER": "o"})
        base = f"/v1/sandboxes/{sandbox_id}/exec"
        script = {"cmd": "/bin/bash", "args": ["-c", "echo $DECLARED $OTHER"]}
        assert data(await client.post(base, json=script))["result"]["stdout"] == "base o\n"
        override = await client.post(base, json={**script, "env": {"DECLARED": "call"}})
        assert data(override)["result"]["stdout"] == "call o\n"
        refused = await client.post(base, json={**script, "env": {"UNDECLARED": "x"}})
        assert refused.status_code == 400
        assert "UNDECLARED" in refused.json()["data"]["env"]


async def test_exec_signal_exit_code(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        response = await client.post(
            f"/v1/sandboxes/{sandbox_id}/exec",
            json={"cmd": "/bin/bash", "args": ["-c", "kill -KILL $$"]},
        )
        assert data(response)["result"]["exit_code"] == 137


async def test_exec_stream_frames(emulator: Emulator) -> None:
    await emulator.admin.settings(heartbeat_ms=100)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        frames = []
        async with client.stream(
            "POST",
            f"/v1/sandboxes/{sandbox_id}/exec",
            params={"stream": "true"},
            json={"cmd": "/bin/bash", "args": ["-c", "echo a; sleep 0.35; echo b >&2; exit 4"]},
        ) as response:
            assert response.headers["content-type"] == "application/x-ndjson"
            async for line in response.aiter_lines():
                if line:
                    frames.append(json.loads(line))
        assert frames[0] == {"stdout": "a\n"}
        assert frames[-1] == {"exit_code": 4}
        assert {"stderr": "b\n"} in frames
        assert {"hb": True} in frames
        assert all(len(frame) == 1 for frame in frames)


async def test_exec_stream_spawn_failure(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        response = await client.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": "nope-not-here", "stream": True}
        )
        lines = [json.loads(x) for x in response.text.splitlines()]
        assert "error" in lines[0] and lines[-1] == {"exit_code": -1}


async def test_buffered_exec_returns_though_a_background_child_holds_stdout(
    emulator: Emulator,
) -> None:
    # The drain window ends the call once the held pipes stay quiet; the child lives on.
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        url = f"/v1/sandboxes/{sandbox_id}/exec"
        script = "sleep 300 & echo $! > /tmp/child; echo hi; exit 3"
        response = await client.post(url, json={"cmd": "/bin/bash", "args": ["-c", script]})
        assert data(response)["result"] == {"stdout": "hi\n", "stderr": "", "exit_code": 3}
        alive = {"cmd": "/bin/bash", "args": ["-c", "kill -0 $(cat /tmp/child) && echo alive"]}
        assert data(await client.post(url, json=alive))["result"]["stdout"] == "alive\n"
