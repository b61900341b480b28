"""An ``apiUrl`` with a gateway's path prefix: requests go to ``<prefix>/v1/...``, pacing stays
keyed by the origin (the rate limit is per caller IP)."""

from __future__ import annotations

import pytest
from pytest_httpserver import HTTPServer

from provider.config import parse_config
from provider.createos.pacer import pacer_for
from provider.createos.pool import ConnectionPool
from tests.createos.scripts import SB, ok, running

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
async def test_requests_go_under_the_prefix_and_pacing_keys_on_the_origin(
    httpserver: HTTPServer, suffix: str
) -> None:
    origin = httpserver.url_for("/").rstrip("/")
    config = parse_config({"shape": "s-1vcpu-1gb", "apiUrl": f"{origin}/gw/createos{suffix}"})
    httpserver.expect_request(f"/gw/createos/v1/sandboxes/{SB}").respond_with_response(
        ok(running())
    )
    httpserver.expect_request("/gw/createos/v1/sandboxes").respond_with_response(
        ok({"data": [running()], "pagination": {"total": 1}})
    )

    pool = ConnectionPool()
    try:
        async with pool.client(config.api_url, "key") as api:
            assert (await api.get_sandbox(SB)).id == SB
            assert [v.id for v in await api.list_sandboxes(status="paused")] == [SB]
    finally:
        await pool.aclose()

    assert config.api_url == f"{origin}/gw/createos"
    assert [request.path for request, _ in httpserver.log] == [
        f"/gw/createos/v1/sandboxes/{SB}",
        "/gw/createos/v1/sandboxes",
    ]
    assert pacer_for(config.api_url) is pacer_for(origin)
    assert pacer_for(config.api_url).origin == origin
