"""Admin API: faults fire exactly N times (each action kind), request log, settings, auth."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from provider.emulator import Emulator, EmulatorAdminError

from .helpers import api, create_sandbox, data, sh, start_process

pytestmark = pytest.mark.anyio


async def test_status_fault_fires_exactly_n_times_without_performing(emulator: Emulator) -> None:
    await emulator.admin.add_fault("POST", r"^/v1/sandboxes$", times=2, status=503, retry_after="2")
    async with api(emulator) as client:
        first = await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        second = await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        third = await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        assert [first.status_code, second.status_code, third.status_code] == [503, 503, 200]
        assert first.headers["retry-after"] == "2"
        assert first.json() == {"status": "error", "message": "injected server error", "code": 503}
        assert first.headers["x-request-id"]
    state = await emulator.admin.state()
    assert len(state["sandboxes"]) == 1
    log = await emulator.admin.requests()
    assert [e["status"] for e in log] == [503, 503, 200]


async def test_status_fault_with_body_and_method_wildcard(emulator: Emulator) -> None:
    secret_body = {"status": "fail", "data": {"auth": "key sk-live-SECRET is not valid"}}
    await emulator.admin.add_fault("*", r"/v1/sandboxes/[^/]+$", status=401, body=secret_body)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        hit = await client.get(f"/v1/sandboxes/{sandbox_id}")
        assert hit.status_code == 401 and hit.json() == secret_body
        assert (await client.get(f"/v1/sandboxes/{sandbox_id}")).status_code == 200


async def test_delay_fault_then_performs(emulator: Emulator) -> None:
    await emulator.admin.add_fault("POST", r"^/v1/sandboxes$", delay_ms=3000)
    async with httpx.AsyncClient(
        base_url=emulator.base_url, headers={"X-Api-Key": "test-key"}, timeout=0.5
    ) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            await impatient.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "name": "late"})
    with anyio.fail_after(20):  # performed once the delay is over
        while not (await emulator.admin.requests()):
            await anyio.sleep(0.05)
    assert (await emulator.admin.requests())[0]["status"] == 200
    assert [s["name"] for s in (await emulator.admin.state())["sandboxes"]] == ["late"]
    async with httpx.AsyncClient(
        base_url=emulator.base_url, headers={"X-Api-Key": "test-key"}, timeout=2.5
    ) as client:
        second = await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        assert second.status_code == 200  # the fault fired once: no 3 s delay any more


async def test_drop_fault_closes_without_performing(emulator: Emulator) -> None:
    await emulator.admin.add_fault("POST", r"^/v1/sandboxes$", drop=True)
    async with api(emulator) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        assert (await emulator.admin.state())["sandboxes"] == []
        assert (
            await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        ).status_code == 200
    log = await emulator.admin.requests()
    assert [e["status"] for e in log] == [0, 200]


async def test_lose_response_performs_then_closes(emulator: Emulator) -> None:
    await emulator.admin.add_fault("POST", r"^/v1/sandboxes$", lose_response=True)
    async with api(emulator) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "name": "orphan"})
        listed = data(await client.get("/v1/sandboxes"))["data"]
        assert [row["name"] for row in listed] == ["orphan"]
        assert listed[0]["status"] == "running"
    assert (await emulator.admin.requests())[0]["status"] == 200


async def test_stream_lines_fault_scripts_connect(emulator: Emulator) -> None:
    lines = ['{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk="}', "not json", "{}"]
    await emulator.admin.add_fault("GET", r"/connect$", stream_lines=lines)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        proc = await start_process(client, sandbox_id, "echo real")
        url = f"/v1/sandboxes/{sandbox_id}/processes/{proc['process_id']}/connect"
        async with client.stream("GET", url) as response:
            assert response.headers["content-type"] == "application/x-ndjson"
            got = [line async for line in response.aiter_lines()]
        assert got == lines
        async with client.stream("GET", url) as response:
            real = [json.loads(line) async for line in response.aiter_lines() if line]
        assert real[-1] == {"type": "exit", "exit_code": 0}


async def test_cut_after_frames_closes_mid_stream(emulator: Emulator) -> None:
    await emulator.admin.add_fault("GET", r"/connect$", cut_after_frames=2)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        proc = await start_process(
            client, sandbox_id, "for i in 1 2 3 4 5; do echo $i; sleep 0.02; done"
        )
        await client.get(f"/v1/sandboxes/{sandbox_id}/processes/{proc['process_id']}/wait")
        url = f"/v1/sandboxes/{sandbox_id}/processes/{proc['process_id']}/connect"
        frames: list[dict[str, Any]] = []
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream("GET", url) as response:
                async for line in response.aiter_lines():
                    if line:
                        frames.append(json.loads(line))
        assert [f["seq"] for f in frames] == [1, 2]
        async with client.stream("GET", url, params={"after": 2}) as response:
            rest = [json.loads(line) async for line in response.aiter_lines() if line]
        assert [f.get("seq") for f in rest] == [3, 4, 5, None]


async def test_cut_after_bytes_on_connect_splits_a_character(emulator: Emulator) -> None:
    await emulator.admin.add_fault(
        "GET",
        r"/connect$",
        stream_lines=['{"type":"data","seq":1,"stream":"stdout","data_base64":"4oKs"}'],
        cut_after_bytes=40,
    )
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        proc = await start_process(client, sandbox_id, "true")
        url = f"/v1/sandboxes/{sandbox_id}/processes/{proc['process_id']}/connect"
        received = b""
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream("GET", url) as response:
                async for chunk in response.aiter_raw():
                    received += chunk
        assert received == b'{"type":"data","seq":1,"stream":"stdout","data_base64":"4oKs"}'[:40]


async def test_cut_after_bytes_on_file_download(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        url = f"/v1/sandboxes/{sandbox_id}/files"
        await client.put(url, params={"path": "/tmp/f"}, content=b"0123456789" * 1000)
        await emulator.admin.add_fault("GET", r"/files$", times=2, cut_after_bytes=1234)
        for _ in range(2):
            received = b""
            with pytest.raises(httpx.RemoteProtocolError):
                async with client.stream("GET", url, params={"path": "/tmp/f"}) as response:
                    async for chunk in response.aiter_raw():
                        received += chunk
            assert received == (b"0123456789" * 1000)[:1234]
        whole = await client.get(url, params={"path": "/tmp/f"})
        assert len(whole.content) == 10_000


async def test_clear_faults_and_logging_of_queries(emulator: Emulator) -> None:
    await emulator.admin.add_fault("GET", "healthz", times=5, status=500)
    await emulator.admin.clear_faults()
    async with api(emulator, key=None) as client:
        assert (await client.get("/healthz", params={"x": "1"})).status_code == 200
    log = await emulator.admin.requests()
    assert log[0]["path"] == "/healthz" and log[0]["query"] == "x=1"
    assert log[0]["auth"] == "public" and isinstance(log[0]["time"], float)
    assert await emulator.admin.requests(since=log[-1]["seq"]) == []


async def test_settings_force_state_and_reset(emulator: Emulator) -> None:
    settings = await emulator.admin.settings()
    assert settings["pause_delay_ms"] == 200 and settings["journal_bytes"] == 1048576
    changed = await emulator.admin.settings(pause_delay_ms=5, stale_reads=1)
    assert changed["pause_delay_ms"] == 5 and changed["stale_reads"] == 1
    with pytest.raises(EmulatorAdminError):
        await emulator.admin.settings(no_such_knob=1)
    with pytest.raises(EmulatorAdminError):
        await emulator.admin.settings(create_mode="later")
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        await emulator.admin.force_state(sandbox_id, "error")
        assert data(await client.get(f"/v1/sandboxes/{sandbox_id}"))["status"] == "error"
        resumed = await client.post(f"/v1/sandboxes/{sandbox_id}/resume")
        assert resumed.status_code == 202
        await emulator.admin.force_state(sandbox_id, "destroyed")
        view = data(await client.get(f"/v1/sandboxes/{sandbox_id}"))
        assert view["status"] == "destroyed"
        await create_sandbox(client)
    await emulator.admin.reset()
    assert (await emulator.admin.state())["sandboxes"] == []
    assert (await emulator.admin.settings())["pause_delay_ms"] == 200
    assert await emulator.admin.requests() == []


async def test_admin_needs_the_token(emulator: Emulator) -> None:
    async with httpx.AsyncClient(base_url=emulator.base_url) as client:
        assert (await client.get("/_emulator/state")).status_code == 401
        wrong = await client.get("/_emulator/state", headers={"X-Emulator-Token": "nope"})
        assert wrong.status_code == 401
        good = await client.get(
            "/_emulator/state", headers={"X-Emulator-Token": emulator.admin_token}
        )
        assert good.status_code == 200
    assert await emulator.admin.requests() == []


async def test_process_history_outlives_the_sandbox(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        first = (await start_process(client, sandbox_id, "echo one"))["process_id"]
        second = (await start_process(client, sandbox_id, "echo two", cwd="/tmp"))["process_id"]
        assert (await client.delete(f"/v1/sandboxes/{sandbox_id}")).status_code == 200
    history = await emulator.admin.process_history()
    assert [(p["process_id"], p["args"], p["cwd"]) for p in history] == [
        (first, ["-c", "echo one"], "/root"),
        (second, ["-c", "echo two"], "/tmp"),
    ]
    assert {p["cmd"] for p in history} == {"/bin/bash"}
    assert {p["sandbox_id"] for p in history} == {sandbox_id}
    await emulator.admin.reset()
    assert await emulator.admin.process_history() == []


async def test_exec_history_keeps_every_exec_with_its_times(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        assert (await sh(client, sandbox_id, "echo buffered"))["stdout"] == "buffered\n"
        streamed = await client.post(
            f"/v1/sandboxes/{sandbox_id}/exec",
            params={"stream": "true"},
            json={"cmd": "/bin/echo", "args": ["streamed"]},
        )
        assert '{"exit_code": 0}' in streamed.text  # read to its end: the leader has exited
        assert (await client.delete(f"/v1/sandboxes/{sandbox_id}")).status_code == 200
    history = await emulator.admin.exec_history()
    assert [(e["cmd"], e["args"], e["streamed"]) for e in history] == [
        ("/bin/bash", ["-c", "echo buffered"], False),
        ("/bin/echo", ["streamed"], True),
    ]
    assert {e["sandbox_id"] for e in history} == {sandbox_id}
    assert all(e["exited"] is not None and e["time"] <= e["exited"] for e in history)
    assert history[0]["exited"] <= history[1]["time"]
    assert await emulator.admin.process_history() == []  # execs are not managed processes
    await emulator.admin.reset()
    assert await emulator.admin.exec_history() == []
