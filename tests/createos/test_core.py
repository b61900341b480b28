"""The client core against exact HTTP scripts: the wire, envelopes, statuses, retries, transport
errors and identifiers (provider/createos/core.py, models.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import anyio
import httpx
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Response

from provider.createos.client import CreateOSClient
from provider.createos.core import retry_policy
from provider.createos.errors import (
    APIConnectionError,
    APIProtocolError,
    APIStatusError,
    APITimeout,
    AuthError,
    Conflict,
    InvalidIdentifier,
    NotFound,
    RateLimited,
    ServerError,
)
from provider.createos.models import SandboxView
from tests.createos.conftest import API_KEY, CountingPacer
from tests.createos.scripts import PROC, SB, fail, ok, process, running

pytestmark = pytest.mark.anyio


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


@pytest.mark.parametrize(
    ("status", "hint", "deadline"),
    [(503, "7", None), (429, "90", 300.0)],  # a long hint is waited for when the deadline allows
)
async def test_retry_after_seconds_takes_priority_over_backoff(
    httpserver: HTTPServer,
    client: CreateOSClient,
    delays: list[float],
    status: int,
    hint: str,
    deadline: float | None,
) -> None:
    httpserver.expect_ordered_request(f"/v1/sandboxes/{SB}").respond_with_response(
        fail(status, headers={"Retry-After": hint})
    )
    httpserver.expect_ordered_request(f"/v1/sandboxes/{SB}").respond_with_response(ok(running()))

    with anyio.fail_after(deadline):
        await client.get_sandbox(SB)

    assert delays == [float(hint)]
    assert len(httpserver.log) == 2


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


async def test_a_retry_after_past_the_deadline_raises_at_once_saying_so(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float]
) -> None:
    httpserver.expect_request("/v1/sandboxes", method="POST").respond_with_response(
        fail(429, headers={"Retry-After": "90"})
    )

    with anyio.fail_after(30), pytest.raises(RateLimited) as caught:
        await client.create_sandbox(shape="s-1vcpu-1gb", name="pc-1", rootfs=None, region=None)

    assert caught.value.retry_after == 90.0
    assert str(caught.value).startswith(
        "CreateOS create sandbox failed: HTTP 429 (rate limited): the server asked to retry in "
        "90 s, past this operation's deadline ("
    )
    assert delays == []
    assert len(httpserver.log) == 1


async def test_without_a_deadline_a_retry_after_beyond_the_cap_raises_at_once(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float]
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}").respond_with_response(
        fail(429, headers={"Retry-After": "601"})
    )

    with pytest.raises(RateLimited) as caught:
        await client.get_sandbox(SB)

    assert caught.value.retry_after == 601.0
    assert "longer than the 600 s a call without a deadline waits" in str(caught.value)
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


@pytest.mark.parametrize("status", [429, 503, 500, 502, 504, 408])
@pytest.mark.parametrize(("path", "call"), [p[1:] for p in POSTS], ids=[p[0] for p in POSTS])
async def test_posts_are_retried_on_429_and_503_only(
    httpserver: HTTPServer,
    client: CreateOSClient,
    delays: list[float],
    path: str,
    call: PostCall,
    status: int,
) -> None:
    answer = {
        "/v1/sandboxes": running(),
        f"/v1/sandboxes/{SB}/exec": {"result": {"stdout": "", "stderr": "", "exit_code": 0}},
        f"/v1/sandboxes/{SB}/processes": process(),
    }.get(path, {"ok": True})
    httpserver.expect_ordered_request(path, method="POST").respond_with_response(fail(status))
    httpserver.expect_ordered_request(path, method="POST").respond_with_response(ok(answer))
    retried = status in (429, 503)  # the server says it did not process the request

    if retried:
        await call(client)
    else:
        with pytest.raises(APIStatusError) as caught:
            await call(client)
        assert caught.value.status == status
        assert caught.value.rejected is (status == 408)  # a 5xx other than 503: outcome unknown

    assert len(httpserver.log) == (2 if retried else 1)
    assert len(delays) == (1 if retried else 0)


@pytest.mark.parametrize(("path", "call"), [p[1:] for p in POSTS], ids=[p[0] for p in POSTS])
async def test_a_post_answered_503_after_its_retries_is_a_definite_rejection(
    httpserver: HTTPServer, client: CreateOSClient, delays: list[float], path: str, call: PostCall
) -> None:
    httpserver.expect_request(path, method="POST").respond_with_response(fail(503))

    with pytest.raises(ServerError) as caught:
        await call(client)

    assert caught.value.rejected  # the server did not process it: nothing was created
    assert len(httpserver.log) == 3
    assert len(delays) == 2


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


@pytest.mark.parametrize(
    ("method", "retry", "statuses", "transport"),
    [
        ("GET", True, {408, 429, 500, 502, 503, 504}, True),
        ("DELETE", True, {408, 429, 500, 502, 503, 504}, True),
        ("PUT", True, {408, 429, 500, 502, 503, 504}, True),
        ("PATCH", True, {408, 429, 500, 502, 503, 504}, True),
        ("GET", False, set(), False),  # a stream opened without retry_open
        ("POST", True, {429, 503}, False),
        ("POST", False, {429, 503}, False),  # a POST stream keeps its "not processed" retries
    ],
)
def test_one_retry_table_for_calls_and_stream_opens(
    method: str, retry: bool, statuses: set[int], transport: bool
) -> None:
    assert retry_policy(method, retry=retry) == (frozenset(statuses), transport)
