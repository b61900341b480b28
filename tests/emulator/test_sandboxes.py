"""Sandbox create validation, views, list, delete, transitions, patch, egress, fork."""

from __future__ import annotations

import stat
from typing import Any

import anyio
import pytest

from provider.emulator import Emulator
from provider.emulator.routes_sandboxes import CREATE_RESPONSE_FIELDS

from .helpers import api, create_sandbox, data, sh, wait_status, wait_status_quietly

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "shape"),
        ({"shape": "s-9"}, "shape"),
        ({"shape": "s-1vcpu-1gb", "rootfs": "windows:11"}, "rootfs"),
        ({"shape": "s-1vcpu-1gb", "region": "eu"}, "region"),
        ({"shape": "s-1vcpu-1gb", "auto_pause_after_seconds": 59}, "auto_pause_after_seconds"),
        ({"shape": "s-1vcpu-1gb", "auto_pause_after_seconds": 86_401}, "auto_pause_after_seconds"),
        ({"shape": "s-1vcpu-1gb", "envs": {"1BAD": "x"}}, "envs"),
        ({"shape": "s-1vcpu-1gb", "envs": {"BIG": "x" * 4097}}, "envs"),
        ({"shape": "s-1vcpu-1gb", "envs": {f"K{i}": "v" for i in range(65)}}, "envs"),
        ({"shape": "s-1vcpu-1gb", "bandwidth_quota_bytes": 5}, "bandwidth_quota_bytes"),
        ({"shape": "s-1vcpu-1gb", "name": "Not A Hostname"}, "name"),
    ],
)
async def test_create_validation(emulator: Emulator, body: dict[str, Any], field: str) -> None:
    async with api(emulator) as client:
        response = await client.post("/v1/sandboxes", json=body)
        assert response.status_code == 400
        envelope = response.json()
        assert envelope["status"] == "fail"
        assert field in envelope["data"]
    assert (await emulator.admin.state())["sandboxes"] == []


async def test_create_view_and_get_view(emulator: Emulator) -> None:
    async with api(emulator) as client:
        response = await client.post(
            "/v1/sandboxes",
            json={
                "shape": "s-2vcpu-4gb",
                "rootfs": "debian:13",
                "region": "us",
                "name": "my-box",
                "envs": {"SECRET_TOKEN": "s3cr3t"},
                "auto_pause_after_seconds": 600,
                "ingress_enabled": False,
            },
        )
        view = data(response)
        assert view["status"] == "running"
        assert (view["vcpu"], view["mem_mib"], view["disk_mib"]) == (2, 4096, 10240)
        assert view["name"] == "my-box" and view["rootfs"] == "debian:13"
        assert isinstance(view["spawn_ms"], int) and view["bandwidth_quota_bytes"] > 0
        got = data(await client.get(f"/v1/sandboxes/{view['id']}"))
        assert got["id"] == view["id"] and got["envs"] == ["SECRET_TOKEN"]
        assert "s3cr3t" not in response.text and got["auto_pause_after_seconds"] == 600
        assert "running_at" in got and "destroyed_at" not in got
        result = await sh(client, view["id"], 'echo "$SECRET_TOKEN $(hostname) $HOME $PWD"')
        assert result["stdout"] == "s3cr3t my-box /root /root\n"
        duplicate = await client.post(
            "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "name": "my-box"}
        )
        assert duplicate.status_code == 409


async def test_list_filters_by_status_and_paginates(emulator: Emulator) -> None:
    async with api(emulator) as client:
        ids = [await create_sandbox(client) for _ in range(3)]
        await client.post(f"/v1/sandboxes/{ids[0]}/pause")
        await wait_status(client, ids[0], "paused")
        paused = data(await client.get("/v1/sandboxes", params={"status": "paused"}))
        assert [r["id"] for r in paused["data"]] == [ids[0]]
        running = data(await client.get("/v1/sandboxes", params={"status": "running"}))
        assert {r["id"] for r in running["data"]} == set(ids[1:])
        page = data(await client.get("/v1/sandboxes", params={"limit": 2, "offset": 2}))
        assert page["pagination"] == {"total": 3, "limit": 2, "offset": 2, "count": 1}


async def test_delete_is_idempotent_and_row_expires(emulator: Emulator) -> None:
    await emulator.admin.settings(destroyed_retention_ms=300)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        first = await client.delete(f"/v1/sandboxes/{sandbox_id}")
        assert first.status_code == 200
        assert data(first) == {"id": sandbox_id, "status": "destroying"}
        view = await wait_status(client, sandbox_id, "destroyed")
        assert "destroyed_at" in view
        again = await client.delete(f"/v1/sandboxes/{sandbox_id}")
        assert data(again) == {"id": sandbox_id, "status": "destroyed"}
        listed = data(await client.get("/v1/sandboxes", params={"status": "destroyed"}))
        assert [r["id"] for r in listed["data"]] == [sandbox_id]
        for _ in range(200):
            if (await client.get(f"/v1/sandboxes/{sandbox_id}")).status_code == 404:
                break
            await __import__("anyio").sleep(0.02)
        assert (await client.get(f"/v1/sandboxes/{sandbox_id}")).status_code == 404
        assert (await client.delete(f"/v1/sandboxes/{sandbox_id}")).status_code == 404


async def test_delete_of_paused_sandbox_is_destroyed_at_once(emulator: Emulator) -> None:
    await emulator.admin.settings(pause_delay_ms=0)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        await client.post(f"/v1/sandboxes/{sandbox_id}/pause")
        await wait_status(client, sandbox_id, "paused")
        response = await client.delete(f"/v1/sandboxes/{sandbox_id}")
        assert data(response)["status"] == "destroyed"


async def test_pause_resume_codes_and_conflicts(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        base = f"/v1/sandboxes/{sandbox_id}"
        resumed = await client.post(f"{base}/resume")
        assert resumed.status_code == 200 and data(resumed)["status"] == "running"
        pausing = await client.post(f"{base}/pause")
        assert pausing.status_code == 202 and data(pausing)["status"] == "pausing"
        again = await client.post(f"{base}/pause")
        assert again.status_code == 409
        assert (await client.post(f"{base}/resume")).status_code == 409
        view = await wait_status(client, sandbox_id, "paused")
        assert "paused_at" in view
        assert (await client.post(f"{base}/pause")).status_code == 200
        for method, path, body in (
            ("POST", "/exec", {"cmd": "true"}),
            ("PUT", "/files?path=/tmp/x", None),
            ("GET", "/files?path=/tmp/x", None),
            ("POST", "/processes", {"cmd": "true"}),
        ):
            response = await client.request(method, base + path, json=body)
            assert response.status_code == 409, (method, path)
            assert response.json()["status"] == "fail"
        resuming = await client.post(f"{base}/resume")
        assert resuming.status_code == 202 and data(resuming)["status"] == "resuming"
        view = await wait_status(client, sandbox_id, "running")
        assert "last_resumed_at" in view
        assert (await sh(client, sandbox_id, "echo back"))["stdout"] == "back\n"


async def test_stale_reads_show_the_old_state(emulator: Emulator) -> None:
    await emulator.admin.settings(stale_reads=2, pause_delay_ms=5000)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client)
        await client.post(f"/v1/sandboxes/{sandbox_id}/pause")
        seen = [data(await client.get(f"/v1/sandboxes/{sandbox_id}"))["status"] for _ in range(3)]
        assert seen == ["running", "running", "pausing"]


async def test_async_create_reports_creating_first(emulator: Emulator) -> None:
    await emulator.admin.settings(create_mode="async", create_delay_ms=300)
    async with api(emulator) as client:
        response = await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        view = data(response)
        assert view["status"] == "creating"
        busy = await client.post(f"/v1/sandboxes/{view['id']}/exec", json={"cmd": "true"})
        assert busy.status_code == 409
        await wait_status(client, view["id"], "running")
        assert (await sh(client, view["id"], "echo ok"))["stdout"] == "ok\n"


async def test_create_can_answer_without_status(emulator: Emulator) -> None:
    await emulator.admin.settings(create_omits_status=True)
    async with api(emulator) as client:
        view = data(await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"}))
        # The TS SDK's CreateSandboxResponse (ingress_url_template only with ingress on).
        assert set(view) == CREATE_RESPONSE_FIELDS - {"ingress_url_template"}
        assert "status" not in view and "created_at" not in view
        assert view["shape"] == "s-1vcpu-1gb"
        assert data(await client.get(f"/v1/sandboxes/{view['id']}"))["status"] == "running"
        await client.post(f"/v1/sandboxes/{view['id']}/pause")
        await wait_status(client, view["id"], "paused")
        forked = data(await client.post(f"/v1/sandboxes/{view['id']}/fork"))
        assert forked["status"] == "forking"  # the knob is about create only


async def test_patch_auto_pause_and_egress(emulator: Emulator) -> None:
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client, egress=["example.com:443"])
        base = f"/v1/sandboxes/{sandbox_id}"
        patched = data(await client.patch(base, json={"auto_pause_after_seconds": 120}))
        assert patched["auto_pause_after_seconds"] == 120
        assert (await client.patch(base, json={"auto_pause_after_seconds": 5})).status_code == 400
        cleared = data(await client.patch(base, json={"disable_auto_pause": True}))
        assert "auto_pause_after_seconds" not in cleared
        assert data(await client.patch(base, json={"ingress_enabled": True}))["ingress_enabled"]
        assert data(await client.get(f"{base}/egress")) == {
            "id": sandbox_id,
            "egress": ["example.com:443"],
        }
        swapped = await client.put(
            f"{base}/egress", json={"egress": ["*.github.com", "10.0.0.0/8"]}
        )
        assert data(swapped)["egress"] == ["*.github.com", "10.0.0.0/8"]
        assert data(await client.put(f"{base}/egress", json={"egress": None}))["egress"] == []
        assert (await client.put(f"{base}/egress", json={"egress": [3]})).status_code == 400


async def test_auto_pause_after_idle(emulator: Emulator) -> None:
    await emulator.admin.settings(min_auto_pause_seconds=1, pause_delay_ms=0)
    async with api(emulator) as client:
        sandbox_id = await create_sandbox(client, auto_pause_after_seconds=1)
        await wait_status_quietly(emulator, sandbox_id, "paused")  # a GET would be activity
        view = data(await client.get(f"/v1/sandboxes/{sandbox_id}"))
        assert view["auto_pause_after_seconds"] == 1


async def test_fork_copies_files_of_a_paused_sandbox(emulator: Emulator) -> None:
    await emulator.admin.settings(pause_delay_ms=0, fork_busy_ms=0)
    async with api(emulator) as client:
        source = await create_sandbox(client, envs={"A": "1"})
        await sh(client, source, "echo kept > /paperclip-workspace/f; echo home > /root/h")
        early = await client.post(f"/v1/sandboxes/{source}/fork")
        assert early.status_code == 409
        await client.post(f"/v1/sandboxes/{source}/pause")
        await wait_status(client, source, "paused")
        forked = data(await client.post(f"/v1/sandboxes/{source}/fork", json={}))
        assert forked["status"] == "forking" and forked["id"] != source
        view = await wait_status(client, forked["id"], "running")
        assert view["forked_from"] == source and view["envs"] == ["A"]
        result = await sh(client, forked["id"], "cat /paperclip-workspace/f /root/h; echo $A")
        assert result["stdout"] == "kept\nhome\n1\n"
        assert data(await client.get(f"/v1/sandboxes/{source}"))["status"] == "paused"
        await sh(client, forked["id"], "echo changed > /paperclip-workspace/f")
        await client.post(f"/v1/sandboxes/{source}/resume")
        await wait_status(client, source, "running")
        assert (await sh(client, source, "cat /paperclip-workspace/f"))["stdout"] == "kept\n"


async def test_fork_busy_window_answers_409(emulator: Emulator) -> None:
    await emulator.admin.settings(pause_delay_ms=0, fork_busy_ms=60_000)
    async with api(emulator) as client:
        source = await create_sandbox(client)
        await client.post(f"/v1/sandboxes/{source}/pause")
        await wait_status(client, source, "paused")
        busy = await client.post(f"/v1/sandboxes/{source}/fork")
        assert busy.status_code == 409
        await emulator.admin.settings(fork_busy_ms=0)
        assert (await client.post(f"/v1/sandboxes/{source}/fork")).status_code == 200


async def test_accept_any_shape_and_no_credit_switches(emulator: Emulator) -> None:
    async with api(emulator) as client:
        await emulator.admin.settings(accept_any_shape=True)
        assert (await client.post("/v1/sandboxes", json={"shape": "s-99"})).status_code == 200
        await emulator.admin.settings(no_credit=True)
        assert (
            await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
        ).status_code == 402


async def test_sandboxes_deleted_while_they_boot_go_cleanly_and_leave_others_bootable(
    emulator: Emulator,
) -> None:
    await emulator.admin.settings(create_mode="async")
    assert emulator.core is not None
    shared = emulator.core.data_dir / "sandboxes"
    async with api(emulator) as client:
        deleted: list[str] = []
        for pause in (0.0, 0.005, 0.02, 0.05, 0.1, 0.2):
            created = await client.post("/v1/sandboxes", json={"shape": "s-1vcpu-1gb"})
            sandbox_id = data(created)["id"]
            await anyio.sleep(pause)  # the delete lands at a different point of the boot
            assert (await client.delete(f"/v1/sandboxes/{sandbox_id}")).status_code == 200
            deleted.append(sandbox_id)
        for sandbox_id in deleted:
            with anyio.fail_after(20):
                while True:
                    answer = await client.get(f"/v1/sandboxes/{sandbox_id}")
                    status = None if answer.status_code == 404 else data(answer)["status"]
                    assert status in (None, "destroying", "destroyed"), status
                    if status in (None, "destroyed"):
                        break
                    await anyio.sleep(0.02)
        assert stat.S_IMODE(shared.stat().st_mode) == 0o711
        assert not [p.name for p in shared.iterdir() if p.name in deleted]
        await emulator.admin.settings(create_mode="sync")
        survivor = await create_sandbox(client)
        assert (await sh(client, survivor, "echo ok"))["stdout"] == "ok\n"
