"""Health, catalogs, auth, envelopes and headers."""

from __future__ import annotations

import httpx
import pytest

from provider.emulator import Emulator

from .helpers import OTHER_KEY, api, create_sandbox, data

pytestmark = pytest.mark.anyio


async def test_health_and_catalogs_are_public(emulator: Emulator) -> None:
    async with api(emulator, key=None) as client:
        assert data(await client.get("/healthz")) == {"up": True}
        assert data(await client.get("/readyz")) == {"ready": True}
        shapes = data(await client.get("/v1/shapes"))
        assert shapes["pagination"] == {"total": 11, "limit": 50, "offset": 0, "count": 11}
        ids = [s["id"] for s in shapes["data"]]
        assert ids[0] == "s-1vcpu-256mb" and "s-1vcpu-1gb" in ids and len(set(ids)) == 11
        quarter = next(s for s in shapes["data"] if s["id"] == "s-0.25vcpu-512mb")
        assert quarter["cpu_quota_pct"] == 25
        assert "cpu_quota_pct" not in shapes["data"][0]
        page = data(await client.get("/v1/shapes", params={"limit": 4, "offset": 8}))
        assert page["pagination"] == {"total": 11, "limit": 4, "offset": 8, "count": 3}
        rootfs = data(await client.get("/v1/rootfs"))
        assert rootfs["default"] == "devbox:1"
        assert "devbox:1" in rootfs["rootfs"]
        assert {e["name"] for e in rootfs["entries"]} == set(rootfs["rootfs"])


async def test_every_response_has_request_id_and_json_type(emulator: Emulator) -> None:
    async with api(emulator) as client:
        for response in (
            await client.get("/healthz"),
            await client.get("/v1/sandboxes/sb_nope"),
            await client.get("/nowhere"),
            await client.post("/v1/sandboxes", content=b"not json"),
        ):
            assert response.headers["x-request-id"].startswith("req_")
            assert response.headers["content-type"] == "application/json"
        ids = {(await client.get("/healthz")).headers["x-request-id"] for _ in range(3)}
        assert len(ids) == 3


async def test_auth_missing_invalid_and_bearer_get_401(emulator: Emulator) -> None:
    async with httpx.AsyncClient(base_url=emulator.base_url) as client:
        missing = await client.get("/v1/sandboxes")
        assert missing.status_code == 401
        assert missing.json()["status"] == "fail"
        wrong = await client.get("/v1/sandboxes", headers={"X-Api-Key": "nope"})
        assert wrong.status_code == 401
        bearer = await client.get("/v1/sandboxes", headers={"Authorization": "Bearer test-key"})
        assert bearer.status_code == 401
        whoami = await client.get("/v1/whoami", headers={"X-Api-Key": "test-key"})
        assert whoami.status_code == 200
    log = await emulator.admin.requests()
    assert [e["auth"] for e in log] == ["missing", "invalid", "missing", "ok"]
    assert all("test-key" not in str(e) and "nope" not in str(e) for e in log)


async def test_foreign_key_sees_404_and_its_own_list(emulator: Emulator) -> None:
    async with api(emulator) as mine, api(emulator, OTHER_KEY) as theirs:
        sandbox_id = await create_sandbox(mine)
        for method, path in (
            ("GET", ""),
            ("DELETE", ""),
            ("POST", "/pause"),
            ("POST", "/resume"),
            ("GET", "/files?path=/tmp/x"),
            ("GET", "/processes"),
        ):
            response = await theirs.request(method, f"/v1/sandboxes/{sandbox_id}{path}")
            assert response.status_code == 404, (method, path)
        assert data(await theirs.get("/v1/sandboxes"))["data"] == []
        listed = data(await mine.get("/v1/sandboxes"))["data"]
        assert [row["id"] for row in listed] == [sandbox_id]
        stats = data(await mine.get("/v1/whoami"))["stats"]
        assert stats == {"running": 1, "paused": 0, "other": 0, "total": 1}
        assert data(await mine.get(f"/v1/sandboxes/{sandbox_id}"))["status"] == "running"


async def test_no_redirects_unknown_routes_and_methods(emulator: Emulator) -> None:
    async with api(emulator) as client:
        slash = await client.get("/v1/sandboxes/")
        assert slash.status_code == 404
        assert "location" not in slash.headers
        assert (await client.get("/v1/nothing")).status_code == 404
        assert (await client.put("/v1/sandboxes")).status_code == 405


async def test_rate_limit_answers_429_with_retry_after(emulator: Emulator) -> None:
    await emulator.admin.settings(rate_limit=True, rate_limit_per_minute=5)
    async with api(emulator) as client:
        codes = [(await client.get("/healthz")).status_code for _ in range(5)]
        assert codes == [200] * 5
        limited = await client.get("/v1/sandboxes")
        assert limited.status_code == 429
        assert 1 <= int(limited.headers["retry-after"]) <= 60
        assert limited.json()["status"] == "fail"
        assert (await emulator.admin.state())["sandboxes"] == []
        await emulator.admin.settings(rate_limit=False)
        assert (await client.get("/healthz")).status_code == 200


async def test_ipv6_loopback_listener(emulator: Emulator) -> None:
    try:
        emu = Emulator(api_keys=["k"], host="::1")
        async with emu, httpx.AsyncClient(base_url=emu.base_url) as client:
            assert emu.base_url.startswith("http://[::1]:")
            assert (await client.get("/healthz")).status_code == 200
            assert (await emu.admin.state())["sandboxes"] == []
    except OSError as exc:  # no IPv6 on this host
        pytest.skip(f"IPv6 loopback unavailable: {exc}")
