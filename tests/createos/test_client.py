"""CreateOSClient against exact HTTP scripts (pytest-httpserver, httpx.MockTransport)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from provider.createos.client import UPLOAD_CHUNK, CreateOSClient
from provider.createos.errors import (
    APIConnectionError,
    APIProtocolError,
    APIStatusError,
    APITimeout,
    AuthError,
    Conflict,
    CreateOSError,
    InvalidIdentifier,
    NotFound,
    OutputEvicted,
    RateLimited,
    ServerError,
)
from provider.createos.models import ExecResult, ProcessView, SandboxView
from tests.createos.conftest import API_KEY, CountingPacer

pytestmark = pytest.mark.anyio

SB = "sb_01J8ZABCDEFGHJKMNPQRSTVWXY"
PROC = "proc_01J9A"


def ok(data: Any, status: int = 200) -> Response:
    return Response(
        json.dumps({"status": "success", "data": data}),
        status=status,
        content_type="application/json",
    )


def fail(status: int, data: Any = None, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps({"status": "fail", "data": data}),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def running(sandbox_id: str = SB) -> dict[str, Any]:
    return {"id": sandbox_id, "status": "running", "name": "pc-1", "shape": "s-1vcpu-1gb"}


def process(state: str = "running", **extra: Any) -> dict[str, Any]:
    return {"process_id": PROC, "state": state, "pid": 42, **extra}


# ---------------------------------------------------------------- wire basics


async def test_sends_key_as_x_api_key_with_json_accept_and_user_agent(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request(
        f"/v1/sandboxes/{SB}", method="GET", headers={"X-Api-Key": API_KEY}
    ).respond_with_response(ok(running()))

    view = await client.get_sandbox(SB)

    assert view == SandboxView(SB, "running", name="pc-1", shape="s-1vcpu-1gb")
    request = httpserver.log[0][0]
    assert request.headers["Accept"] == "application/json"
    assert request.headers["User-Agent"].startswith("paperclip-plugin-createos/")
    assert "Authorization" not in request.headers


async def test_redirect_is_refused_as_a_connection_error_and_not_followed(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}").respond_with_response(
        Response("", status=302, headers={"Location": httpserver.url_for("/elsewhere")})
    )
    httpserver.expect_request("/elsewhere").respond_with_response(ok(running()))

    with pytest.raises(APIConnectionError, match="redirect refused"):
        await client.get_sandbox(SB)

    assert [entry[0].path for entry in httpserver.log] == [f"/v1/sandboxes/{SB}"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param(b"<html>maintenance</html>", 200, id="not-json"),
        pytest.param(b'{"status":"success"}', 200, id="missing-data"),
        pytest.param(b'{"status":"ok","data":{}}', 200, id="wrong-status-field"),
        pytest.param(b'{"data":{"id":"sb_1","status":"running"}}', 200, id="no-status-field"),
        pytest.param(b'[{"status":"success","data":{}}]', 200, id="array"),
        pytest.param(b"", 200, id="empty-200"),
        pytest.param(b"   ", 201, id="blank-201"),
    ],
)
async def test_malformed_success_envelopes_are_protocol_errors(
    httpserver: HTTPServer, client: CreateOSClient, body: bytes, status: int
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}").respond_with_response(
        Response(body, status=status, content_type="application/json")
    )

    with pytest.raises(APIProtocolError) as caught:
        await client.get_sandbox(SB)

    assert str(status) in str(caught.value)
    assert len(httpserver.log) == 1


async def test_empty_204_is_a_valid_answer_where_no_data_is_needed(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}/pause", method="POST").respond_with_response(
        Response(b"", status=204)
    )

    await client.pause_sandbox(SB)

    assert len(httpserver.log) == 1


async def test_payload_of_the_wrong_shape_is_a_protocol_error(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}").respond_with_response(
        ok({"id": SB, "status": 3})
    )

    with pytest.raises(APIProtocolError, match="read sandbox"):
        await client.get_sandbox(SB)


async def test_get_sandbox_refuses_an_answer_about_another_sandbox(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}").respond_with_response(ok(running("sb_other")))

    with pytest.raises(APIProtocolError, match="another sandbox"):
        await client.get_sandbox(SB)


# ---------------------------------------------------------------- statuses and retries


async def test_404_is_not_found_without_retry(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float]
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}").respond_with_response(fail(404))

    with pytest.raises(NotFound) as caught:
        await client.get_sandbox(SB)

    assert caught.value.status == 404
    assert caught.value.operation == "read sandbox"
    assert len(httpserver.log) == 1
    assert delays == []


async def test_503_on_a_read_is_retried_twice_then_raised_as_server_error(
    httpserver: HTTPServer, client: CreateOSClient, pacer: CountingPacer, delays: list[float]
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}").respond_with_response(
        Response('{"status":"error","message":"down","code":503}', status=503)
    )

    with pytest.raises(ServerError) as caught:
        await client.get_sandbox(SB)

    assert caught.value.status == 503
    assert "HTTP 503" in str(caught.value)
    assert len(httpserver.log) == 3
    assert len(delays) == 2
    assert pacer.turns == 3  # every attempt waited for its turn


async def test_503_then_success_returns_the_answer(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float]
) -> None:
    httpserver.expect_ordered_request(f"/v1/sandboxes/{SB}").respond_with_response(fail(503))
    httpserver.expect_ordered_request(f"/v1/sandboxes/{SB}").respond_with_response(ok(running()))

    view = await client.get_sandbox(SB)

    assert view.status == "running"
    assert len(delays) == 1


@pytest.mark.parametrize("status", [408, 500, 502, 504])
async def test_idempotent_delete_is_retried_on_transient_statuses(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float], status: int
) -> None:
    httpserver.expect_ordered_request(f"/v1/sandboxes/{SB}", method="DELETE").respond_with_response(
        fail(status)
    )
    httpserver.expect_ordered_request(f"/v1/sandboxes/{SB}", method="DELETE").respond_with_response(
        ok({"id": SB, "status": "destroying"})
    )

    assert await client.delete_sandbox(SB) == "destroying"
    assert len(httpserver.log) == 2


async def test_retry_after_seconds_takes_priority_over_backoff(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float]
) -> None:
    httpserver.expect_ordered_request(f"/v1/sandboxes/{SB}").respond_with_response(
        fail(503, headers={"Retry-After": "7"})
    )
    httpserver.expect_ordered_request(f"/v1/sandboxes/{SB}").respond_with_response(ok(running()))

    await client.get_sandbox(SB)

    assert delays == [7.0]


async def test_retry_after_http_date_is_honoured(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float]
) -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=20), usegmt=True)
    httpserver.expect_ordered_request("/v1/sandboxes", method="POST").respond_with_response(
        fail(429, headers={"Retry-After": when})
    )
    httpserver.expect_ordered_request("/v1/sandboxes", method="POST").respond_with_response(
        ok(running())
    )

    await client.create_sandbox(shape="s-1vcpu-1gb", name="pc-1", rootfs=None, region=None)

    assert len(delays) == 1
    assert 15.0 < delays[0] <= 20.0


async def test_retry_after_beyond_the_cap_raises_at_once_with_the_hint(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float]
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}").respond_with_response(
        fail(429, headers={"Retry-After": "600"})
    )

    with pytest.raises(RateLimited) as caught:
        await client.get_sandbox(SB)

    assert caught.value.retry_after == 600.0
    assert delays == []
    assert len(httpserver.log) == 1


async def test_no_retry_wait_is_started_past_the_callers_deadline(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float]
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}").respond_with_response(
        fail(503, headers={"Retry-After": "30"})
    )

    with anyio.fail_after(10), pytest.raises(ServerError):
        await client.get_sandbox(SB)

    assert delays == []
    assert len(httpserver.log) == 1


PostCall = Callable[[CreateOSClient], Awaitable[object]]
POSTS: list[tuple[str, str, PostCall]] = [
    (
        "create-sandbox",
        "/v1/sandboxes",
        lambda c: c.create_sandbox(shape="s-1vcpu-1gb", name="pc-1", rootfs=None, region=None),
    ),
    ("exec", f"/v1/sandboxes/{SB}/exec", lambda c: c.exec(SB, "/bin/true", [])),
    (
        "create-process",
        f"/v1/sandboxes/{SB}/processes",
        lambda c: c.create_process(SB, cmd="/bin/bash", args=["-lc", "true"]),
    ),
    ("pause", f"/v1/sandboxes/{SB}/pause", lambda c: c.pause_sandbox(SB)),
    ("resume", f"/v1/sandboxes/{SB}/resume", lambda c: c.resume_sandbox(SB)),
    (
        "close-stdin",
        f"/v1/sandboxes/{SB}/processes/{PROC}/stdin/close",
        lambda c: c.close_stdin(SB, PROC),
    ),
]


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408])
@pytest.mark.parametrize(("path", "call"), [p[1:] for p in POSTS], ids=[p[0] for p in POSTS])
async def test_posts_are_never_retried_on_server_errors(
    httpserver: HTTPServer,
    client: CreateOSClient,
    delays: list[float],
    path: str,
    call: PostCall,
    status: int,
) -> None:
    httpserver.expect_request(path, method="POST").respond_with_response(fail(status))

    with pytest.raises(APIStatusError) as caught:
        await call(client)

    assert caught.value.status == status
    assert len(httpserver.log) == 1
    assert delays == []


@pytest.mark.parametrize(("path", "call"), [p[1:] for p in POSTS], ids=[p[0] for p in POSTS])
async def test_posts_are_retried_on_429(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float], path: str, call: PostCall
) -> None:
    answer = {
        "/v1/sandboxes": running(),
        f"/v1/sandboxes/{SB}/exec": {"result": {"stdout": "", "stderr": "", "exit_code": 0}},
        f"/v1/sandboxes/{SB}/processes": process(),
    }.get(path, {"ok": True})
    httpserver.expect_ordered_request(path, method="POST").respond_with_response(fail(429))
    httpserver.expect_ordered_request(path, method="POST").respond_with_response(ok(answer))

    await call(client)

    assert len(httpserver.log) == 2
    assert len(delays) == 1


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


class Refused:
    """A MockTransport handler that fails every request at the transport level."""

    def __init__(self, error: type[httpx.RequestError] = httpx.ConnectError) -> None:
        self.calls = 0
        self.error = error

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        raise self.error("refused", request=request)


async def test_transport_errors_retry_reads_but_never_posts(delays: list[float]) -> None:
    handler = Refused()
    origin = "http://127.0.0.1:9"
    async with CreateOSClient(
        origin, API_KEY, pacer=CountingPacer(origin), transport=httpx.MockTransport(handler)
    ) as api:
        with pytest.raises(APIConnectionError) as read_error:
            await api.get_sandbox(SB)
        assert handler.calls == 3
        with pytest.raises(APIConnectionError) as post_error:
            await api.create_process(SB, cmd="/bin/true", args=[])
        assert handler.calls == 4

    for caught in (read_error, post_error):
        assert "ConnectError" in str(caught.value)
        assert API_KEY not in str(caught.value)
        assert origin not in str(caught.value)


async def test_transport_timeouts_become_api_timeouts(delays: list[float]) -> None:
    handler = Refused(httpx.ReadTimeout)
    origin = "http://127.0.0.1:9"
    async with CreateOSClient(
        origin,
        API_KEY,
        pacer=CountingPacer(origin),
        transport=httpx.MockTransport(handler),
        max_retries=0,
    ) as api:
        with pytest.raises(APITimeout, match="timed out"):
            await api.get_process(SB, PROC)
    assert handler.calls == 1


async def test_cancellation_propagates_as_cancellation(delays: list[float]) -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await anyio.sleep(30)
        return httpx.Response(200)

    origin = "http://127.0.0.1:9"
    async with CreateOSClient(
        origin, API_KEY, pacer=CountingPacer(origin), transport=httpx.MockTransport(slow)
    ) as api:
        with pytest.raises(TimeoutError), anyio.fail_after(0.2):
            await api.get_sandbox(SB)


async def test_401_names_the_status_but_never_the_body_or_key(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    secret = "sk-live-SECRET-0123456789"
    httpserver.expect_request(f"/v1/sandboxes/{SB}").respond_with_response(
        fail(401, {"message": f"invalid key {secret}", "key": API_KEY})
    )

    with pytest.raises(AuthError) as caught:
        await client.get_sandbox(SB)

    message = str(caught.value)
    assert "401" in message
    assert secret not in message
    assert API_KEY not in message
    assert "invalid key" not in message


async def test_409_on_pause_is_a_conflict(httpserver: HTTPServer, client: CreateOSClient) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}/pause", method="POST").respond_with_response(
        fail(409, {"status": "not running"})
    )

    with pytest.raises(Conflict):
        await client.pause_sandbox(SB)


# ---------------------------------------------------------------- identifiers and paths

BAD_IDS = ["", "../etc", "sb_1/../x", "a b", "sb%2F1", "x" * 201, "sb_1?x=1", "ü"]


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_invalid_ids_are_refused_with_zero_requests(
    httpserver: HTTPServer, client: CreateOSClient, bad: str
) -> None:
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: client.get_sandbox(bad),
        lambda: client.delete_sandbox(bad),
        lambda: client.pause_sandbox(bad),
        lambda: client.resume_sandbox(bad),
        lambda: client.exec(bad, "/bin/true", []),
        lambda: client.create_process(bad, cmd="/bin/true", args=[]),
        lambda: client.get_process(SB, bad),
        lambda: client.get_process(bad, PROC),
        lambda: client.delete_process(SB, bad),
        lambda: client.close_stdin(SB, bad),
        lambda: client.put_file(bad, "/tmp/x", b""),
    ]
    for call in calls:
        with pytest.raises(InvalidIdentifier):
            await call()
    with pytest.raises(InvalidIdentifier):
        client.connect(SB, bad, after=0)
    with pytest.raises(InvalidIdentifier):
        client.get_file(bad, "/tmp/x")

    assert len(httpserver.log) == 0


async def test_longest_valid_id_is_accepted(httpserver: HTTPServer, client: CreateOSClient) -> None:
    longest = "S-_9" * 50
    httpserver.expect_request(f"/v1/sandboxes/{longest}").respond_with_response(
        ok(running(longest))
    )

    assert (await client.get_sandbox(longest)).id == longest


async def test_file_path_is_encoded_like_encode_uri_component(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    path = "/paperclip-workspace/a b/ü€!~*'()&=?#%+;,.txt"
    seen: list[tuple[bytes, str]] = []

    def handler(request: Request) -> Response:
        seen.append((request.query_string, request.args["path"]))
        return ok({"bytes": 1, "path": path})

    httpserver.expect_request(f"/v1/sandboxes/{SB}/files", method="PUT").respond_with_handler(
        handler
    )

    await client.put_file(SB, path, b"x")

    expected = "path=" + quote(path, safe="!~*'()")
    assert seen == [(expected.encode(), path)]
    assert "%20" in expected and "!~*'()" in expected and "%26" in expected


# ---------------------------------------------------------------- files


async def test_put_file_streams_a_path_in_chunks_and_is_retried(
    httpserver: HTTPServer, client: CreateOSClient, tmp_path: Path, delays: list[float]
) -> None:
    content = bytes(range(256)) * (4 * UPLOAD_CHUNK // 256) + b"tail!"
    source = tmp_path / "data"
    source.write_bytes(content)
    bodies: list[tuple[bytes, str | None, str | None]] = []

    def handler(request: Request) -> Response:
        bodies.append(
            (request.get_data(), request.headers.get("Content-Length"), request.content_type)
        )
        return fail(503) if len(bodies) == 1 else ok({"bytes": len(content)})

    httpserver.expect_request(f"/v1/sandboxes/{SB}/files", method="PUT").respond_with_handler(
        handler
    )
    progress: list[int] = []

    await client.put_file(SB, "/tmp/data", source, on_progress=progress.append)

    assert len(bodies) == 2
    for body, length, content_type in bodies:
        assert body == content
        assert length == str(len(content))
        assert content_type == "application/octet-stream"
    # One report per chunk of at most UPLOAD_CHUNK bytes, restarting with the retry.
    steps = [b - a for a, b in zip([0, *progress], progress, strict=False) if b > a]
    assert max(steps) <= UPLOAD_CHUNK
    assert progress.count(len(content)) == 2
    assert len(progress) == 2 * 5


async def test_put_file_uploads_empty_bytes(httpserver: HTTPServer, client: CreateOSClient) -> None:
    httpserver.expect_request(
        f"/v1/sandboxes/{SB}/files", method="PUT", data=b""
    ).respond_with_response(ok({}))

    await client.put_file(SB, "/tmp/gate", b"")

    assert httpserver.log[0][0].headers.get("Content-Length") == "0"


async def test_get_file_streams_raw_bytes(httpserver: HTTPServer, client: CreateOSClient) -> None:
    blob = bytes(range(256)) * 4096
    httpserver.expect_request(
        f"/v1/sandboxes/{SB}/files", query_string={"path": "/tmp/blob"}
    ).respond_with_data(blob, content_type="application/octet-stream")

    received = bytearray()
    async with client.get_file(SB, "/tmp/blob") as body:
        async for chunk in body:
            received += chunk

    assert bytes(received) == blob


async def test_get_file_status_errors_are_raised_on_enter(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}/files").respond_with_response(fail(404))
    entered = False

    with pytest.raises(NotFound, match="download file"):
        async with client.get_file(SB, "/tmp/missing"):
            entered = True

    assert not entered


async def test_connect_410_is_output_evicted_on_enter(
    httpserver: HTTPServer, client: CreateOSClient
) -> None:
    httpserver.expect_request(
        f"/v1/sandboxes/{SB}/processes/{PROC}/connect", query_string="after=5"
    ).respond_with_response(fail(410))

    with pytest.raises(OutputEvicted):
        async with client.connect(SB, PROC, after=5):
            pass


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


async def test_put_file_fails_cleanly_when_the_source_shrinks_mid_upload(
    httpserver: HTTPServer, client: CreateOSClient, tmp_path: Path, delays: list[float]
) -> None:
    source = tmp_path / "data"
    source.write_bytes(b"x" * (3 * UPLOAD_CHUNK))
    httpserver.expect_request(f"/v1/sandboxes/{SB}/files", method="PUT").respond_with_response(
        ok({})
    )

    def shrink(sent: int) -> None:
        with source.open("r+b") as handle:
            handle.truncate(sent)

    with pytest.raises(CreateOSError, match="shrank"):
        await client.put_file(SB, "/tmp/data", source, on_progress=shrink)

    assert delays == []


async def test_a_pending_cancellation_wins_over_a_retryable_error(delays: list[float]) -> None:
    with anyio.CancelScope() as scope:

        async def cancel_then_answer(request: httpx.Request) -> httpx.Response:
            scope.cancel()
            return httpx.Response(503, json={"status": "error", "message": "x", "code": 503})

        origin = "http://127.0.0.1:9"
        async with CreateOSClient(
            origin,
            API_KEY,
            pacer=CountingPacer(origin),
            transport=httpx.MockTransport(cancel_then_answer),
        ) as api:
            await api.get_sandbox(SB)

    assert scope.cancelled_caught
    assert delays == []
