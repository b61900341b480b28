"""Sandbox calls against exact HTTP scripts: create, list, delete, exec
(provider/createos/sandboxes.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from provider.createos.client import CreateOSClient
from provider.createos.errors import (
    APIProtocolError,
    NotFound,
)
from provider.createos.models import ExecResult
from tests.createos.scripts import SB, fail, ok, running

pytestmark = pytest.mark.anyio


async def test_create_sandbox_sends_the_exact_body_and_returns_the_id(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request("/v1/sandboxes", method="POST").respond_with_response(
        ok({"id": SB}, status=201)
    )

    sandbox_id = await client.create_sandbox(
        shape="s-1vcpu-1gb", name="pc-token", rootfs="devbox:1", region=None
    )

    assert sandbox_id == SB
    assert httpserver.log[0][0].get_json() == {
        "shape": "s-1vcpu-1gb",
        "name": "pc-token",
        "rootfs": "devbox:1",
        "ingress_enabled": False,
    }


async def test_create_sandbox_refuses_an_invalid_id_in_the_answer(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request("/v1/sandboxes", method="POST").respond_with_response(
        ok({"id": "../../etc", "status": "running"})
    )

    with pytest.raises(APIProtocolError, match="valid sandbox id"):
        await client.create_sandbox(shape="s", name="n", rootfs=None, region="us")


# ---------------------------------------------------------------- lists and payloads


async def test_list_sandboxes_advances_by_items_returned_and_stops_at_total(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    total = 250
    offsets: list[tuple[str, str, str | None]] = []

    def handler(request: Request) -> Response:
        offset = int(request.args["offset"])
        offsets.append((request.args["offset"], request.args["limit"], request.args.get("status")))
        items = [running(f"sb_{i}") for i in range(offset, min(offset + 70, total))]
        pagination = {"total": total, "limit": 70, "offset": offset, "count": len(items)}
        return ok({"data": items, "pagination": pagination})

    httpserver.expect_request("/v1/sandboxes", method="GET").respond_with_handler(handler)

    views = await client.list_sandboxes(status="running")

    assert [v.id for v in views] == [f"sb_{i}" for i in range(total)]
    assert [o[0] for o in offsets] == ["0", "70", "140", "210"]
    assert {o[2] for o in offsets} == {"running"}


@pytest.mark.parametrize(
    "data",
    [
        pytest.param([running("sb_a"), running("sb_b")], id="bare-array"),
        pytest.param({"sandboxes": [running("sb_a"), running("sb_b")]}, id="named-key"),
    ],
)
async def test_list_sandboxes_accepts_older_list_shapes_as_one_page(
    httpserver: HTTPServer, client: CreateOSClient, data: Any
) -> None:
    httpserver.expect_request("/v1/sandboxes").respond_with_response(ok(data))

    views = await client.list_sandboxes()

    assert [v.id for v in views] == ["sb_a", "sb_b"]
    assert len(httpserver.log) == 1


async def test_delete_sandbox_returns_the_answered_status_and_404_raises(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_ordered_request(f"/v1/sandboxes/{SB}", method="DELETE").respond_with_response(
        ok({"id": SB, "status": "destroyed"})
    )
    httpserver.expect_ordered_request(f"/v1/sandboxes/{SB}", method="DELETE").respond_with_response(
        fail(404)
    )

    assert await client.delete_sandbox(SB) == "destroyed"
    with pytest.raises(NotFound):
        await client.delete_sandbox(SB)


async def test_exec_sends_argv_and_stdin_and_reads_the_result(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request(
        f"/v1/sandboxes/{SB}/exec",
        method="POST",
        json={"cmd": "/bin/cat", "args": ["-"], "stdin": "hi"},
    ).respond_with_response(
        ok({"result": {"stdout": "hi", "stderr": "", "exit_code": 0}, "exec_ms": 3.5})
    )

    result = await client.exec(SB, "/bin/cat", ["-"], stdin="hi")

    assert result == ExecResult("hi", "", 0, None)


async def test_exec_launch_failure_without_exit_code_reads_as_minus_one(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}/exec").respond_with_response(
        ok({"result": {"stdout": "", "stderr": "", "error": "no such file"}})
    )

    result = await client.exec(SB, "/nope", [])

    assert result.exit_code == -1
    assert result.error == "no such file"
