"""Process calls against exact HTTP scripts (provider/createos/processes.py)."""

from __future__ import annotations

import pytest
from pytest_httpserver import HTTPServer

from provider.createos.client import CreateOSClient
from provider.createos.errors import (
    APIProtocolError,
    OutputEvicted,
)
from provider.createos.models import ProcessView
from tests.createos.scripts import PROC, SB, fail, ok, process

pytestmark = pytest.mark.anyio


async def test_connect_410_is_output_evicted_on_enter(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request(
        f"/v1/sandboxes/{SB}/processes/{PROC}/connect", query_string="after=5"
    ).respond_with_response(fail(410))

    with pytest.raises(OutputEvicted):
        async with client.connect(SB, PROC, after=5):
            pass


async def test_process_calls_use_their_endpoints(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    base = f"/v1/sandboxes/{SB}/processes"
    httpserver.expect_request(
        base,
        method="POST",
        json={"cmd": "/bin/bash", "args": ["-lc", "x"], "cwd": "/w"},
    ).respond_with_response(ok(process("starting")))
    httpserver.expect_request(f"{base}/{PROC}", method="GET").respond_with_response(
        ok(process("exited", exit_code=7, leader_exited=True))
    )
    httpserver.expect_request(
        f"{base}/{PROC}", method="DELETE", query_string="grace_ms=1000"
    ).respond_with_response(ok(process("exited", signal="SIGTERM", tree_exited=True)))

    created = await client.create_process(SB, cmd="/bin/bash", args=["-lc", "x"], cwd="/w")
    read = await client.get_process(SB, PROC)
    killed = await client.delete_process(SB, PROC, grace_ms=1000)

    assert created == ProcessView(PROC, "starting", pid=42)
    assert (read.exit_code, read.leader_exited, read.tree_exited) == (7, True, False)
    assert (killed.signal, killed.tree_exited) == ("SIGTERM", True)


async def test_process_view_with_a_boolean_pid_is_a_protocol_error(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}/processes/{PROC}").respond_with_response(
        ok({"process_id": PROC, "state": "running", "pid": True})
    )

    with pytest.raises(APIProtocolError):
        await client.get_process(SB, PROC)
