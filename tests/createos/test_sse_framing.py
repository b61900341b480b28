"""SSE-style framing on the NDJSON streams, read as both official SDKs read it: blank lines,
``:`` comments and ``event:``/``id:``/``retry:`` lines skipped, a ``data:`` prefix stripped;
anything else that is not JSON is still a MalformedFrame."""

from __future__ import annotations

import json

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Response

from provider.createos.client import CreateOSClient
from provider.createos.errors import MalformedFrame
from provider.createos.frames import FrameParser, ndjson_payload
from provider.createos.models import DataFrame, ExitFrame
from provider.createos.pacer import RequestPacer
from provider.createos.stream import follow_process_output
from tests.createos.scripts import PROC, SB

DATA = json.dumps({"type": "data", "seq": 1, "stream": "stdout", "data_base64": "aGk="})
EXIT = json.dumps({"type": "exit", "exit_code": 3})
SSE_BODY = (
    ": keepalive\n"
    "\n"
    "retry: 1000\n"
    "event: message\n"
    "id: 1\n"
    f"data: {DATA}\n"
    "\n"
    ":\r\n"
    f"data:{json.dumps({'type': 'heartbeat'})}\r\n"
    "\r\n"
    "event: exit\n"
    f"data: {EXIT}\r\n"
    "\n"
).encode()


def test_the_parser_reads_sse_framed_lines() -> None:
    parser = FrameParser()

    frames = parser.feed(SSE_BODY) + parser.finish()

    assert frames == [DataFrame(1, "stdout", b"hi"), ExitFrame(3, None)]


def test_sse_lines_split_across_chunks_are_joined_first() -> None:
    parser = FrameParser()

    frames = [f for i in range(len(SSE_BODY)) for f in parser.feed(SSE_BODY[i : i + 1])]

    assert frames == [DataFrame(1, "stdout", b"hi"), ExitFrame(3, None)]


@pytest.mark.parametrize(
    "line",
    [b"data: hello", b"data: {not json}", b"hello", b"Data: {}", b" : keepalive", b"event"],
)
def test_other_lines_are_still_malformed(line: bytes) -> None:
    with pytest.raises(MalformedFrame):
        FrameParser().feed(line + b"\n")


@pytest.mark.parametrize(
    ("line", "payload"),
    [
        (b'{"stdout":"a"}', b'{"stdout":"a"}'),
        (b'data: {"stdout":"a"}', b'{"stdout":"a"}'),
        (b'data:{"hb":true}', b'{"hb":true}'),
        (b'data:  {"exit_code":0}', b' {"exit_code":0}'),  # one space only is the prefix's
        (b"data:", None),
        (b"data: ", None),
        (b": ping", None),
        (b"event: stdout", None),
        (b"id: 7", None),
        (b"retry: 5000", None),
        (b"\r", None),
        (b"", None),
    ],
)
def test_exec_stream_lines_unframe_the_same_way(line: bytes, payload: bytes | None) -> None:
    got = ndjson_payload(memoryview(line))
    assert (bytes(got) if got is not None else None) == payload


@pytest.mark.anyio
async def test_an_sse_framed_connect_stream_is_followed_to_its_exit(
    httpserver: HTTPServer,
) -> None:
    httpserver.expect_request(f"/v1/sandboxes/{SB}/processes/{PROC}/connect").respond_with_response(
        Response(SSE_BODY, content_type="text/event-stream")
    )
    origin = httpserver.url_for("/").rstrip("/")

    async with CreateOSClient(origin, "key", pacer=RequestPacer(origin, interval=0)) as api:
        frames = [f async for f in follow_process_output(api, SB, PROC)]

    assert frames == [DataFrame(1, "stdout", b"hi"), ExitFrame(3, None)]
    assert len(httpserver.log) == 1  # no reconnect: every line was understood
