"""follow_process_output and FrameParser: frame rules, replay, reconnect budget."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from provider.createos.client import CreateOSClient
from provider.createos.errors import (
    MalformedFrame,
    MissingExitStatus,
    NotFound,
    OutputEvicted,
    ReconnectBudgetExhausted,
    StreamError,
    StreamGap,
)
from provider.createos.models import DataFrame, ExitFrame
from provider.createos.pacer import RequestPacer
from provider.createos.stream import MAX_LINE_CHARS, FrameParser, follow_process_output

SB = "sb_01"
PROC = "proc_01"
ORIGIN = "http://127.0.0.1:9"
STRICT_B64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


def line(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def data(seq: Any, raw: bytes, stream: str = "stdout") -> bytes:
    payload = base64.b64encode(raw).decode()
    return line({"type": "data", "seq": seq, "stream": stream, "data_base64": payload})


HEARTBEAT = line({"type": "heartbeat"})
EXIT7 = line({"type": "exit", "exit_code": 7})

Step = int | Sequence[bytes | Exception]


class Script:
    """A MockTransport handler serving one scripted answer per connect attempt."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.afters: list[int] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == f"/v1/sandboxes/{SB}/processes/{PROC}/connect"
        self.afters.append(int(request.url.params["after"]))
        step = self.steps.pop(0)
        if isinstance(step, int):
            return httpx.Response(step, json={"status": "fail", "data": None})
        pieces = list(step)

        async def body() -> AsyncIterator[bytes]:
            for piece in pieces:
                if isinstance(piece, Exception):
                    raise piece
                yield piece

        return httpx.Response(200, content=body())


async def follow(script: Script, **kwargs: Any) -> list[DataFrame | ExitFrame]:
    kwargs.setdefault("reconnect_delay", 0)
    async with CreateOSClient(
        ORIGIN,
        "key",
        pacer=RequestPacer(ORIGIN, interval=0),
        transport=httpx.MockTransport(script),
    ) as client:
        return [frame async for frame in follow_process_output(client, SB, PROC, **kwargs)]


def cut() -> httpx.ReadError:
    return httpx.ReadError("connection reset")


# ---------------------------------------------------------------- happy paths and replay


@pytest.mark.anyio
async def test_frames_are_yielded_in_order_and_heartbeats_ignored() -> None:
    script = Script(
        [HEARTBEAT, data(1, b"out"), b"\n  \n", data(2, b"err", "stderr"), HEARTBEAT, EXIT7]
    )

    frames = await follow(script)

    assert frames == [
        DataFrame(1, "stdout", b"out"),
        DataFrame(2, "stderr", b"err"),
        ExitFrame(7, None),
    ]
    assert script.afters == [0]


@pytest.mark.anyio
async def test_cut_inside_a_utf8_character_reconnects_after_last_seq_and_skips_replay() -> None:
    euro = "€".encode()
    first: list[bytes | Exception] = [data(1, euro[:2]), cut()]
    replay = [data(1, euro[:2]), data(2, euro[2:]), data(3, b"warning", "stderr"), EXIT7]
    script = Script(first, replay)

    frames = await follow(script)

    assert script.afters == [0, 1]
    assert frames == [
        DataFrame(1, "stdout", euro[:2]),
        DataFrame(2, "stdout", euro[2:]),
        DataFrame(3, "stderr", b"warning"),
        ExitFrame(7, None),
    ]
    stdout = b"".join(f.data for f in frames if isinstance(f, DataFrame) and f.stream == "stdout")
    assert stdout.decode() == "€"


@pytest.mark.anyio
async def test_eof_without_exit_reconnects_and_a_partial_line_of_a_cut_is_dropped() -> None:
    script = Script(
        [data(1, b"a")],  # clean EOF, no exit
        [data(2, b"b"), data(3, b"c")[:10], cut()],  # cut in the middle of seq 3
        [data(3, b"c"), line({"type": "exit", "signal": "SIGKILL"})],
    )

    frames = await follow(script)

    assert script.afters == [0, 1, 2]
    assert [f.seq for f in frames if isinstance(f, DataFrame)] == [1, 2, 3]
    assert frames[-1] == ExitFrame(None, "SIGKILL")


@pytest.mark.anyio
async def test_last_line_without_newline_is_parsed_at_eof() -> None:
    script = Script([data(1, b"x"), EXIT7.rstrip(b"\n")])

    frames = await follow(script)

    assert frames[-1] == ExitFrame(7, None)


@pytest.mark.anyio
async def test_connect_failures_5xx_and_429_reconnect_and_on_open_runs_once() -> None:
    events: list[str] = []
    script = Script(503, 429, [data(1, b"a"), cut()], [data(2, b"b"), EXIT7])

    async def on_open() -> None:
        events.append(f"open after {len(script.afters)} connects")

    frames = await follow(script, on_open=on_open)

    assert events == ["open after 3 connects"]
    assert script.afters == [0, 0, 0, 1]
    assert frames[-1] == ExitFrame(7, None)


@pytest.mark.anyio
async def test_reconnect_budget_is_exhausted_after_four_attempts_without_output() -> None:
    script = Script(503, [HEARTBEAT, cut()], [HEARTBEAT], 502, [EXIT7])

    with pytest.raises(ReconnectBudgetExhausted, match="4 connection attempts"):
        await follow(script)

    assert script.afters == [0, 0, 0, 0]
    assert len(script.steps) == 1  # the fifth answer was never requested


@pytest.mark.anyio
async def test_a_connection_that_delivers_output_starts_a_fresh_budget() -> None:
    script = Script(
        503,
        [data(1, b"a"), cut()],
        [data(2, b"b")],
        502,
        503,
        [data(3, b"c"), cut()],
        502,
        503,
        [EXIT7],
    )

    frames = await follow(script)

    assert frames[-1] == ExitFrame(7, None)
    assert script.afters == [0, 0, 1, 2, 2, 2, 3, 3, 3]


@pytest.mark.anyio
async def test_a_smaller_budget_is_honoured() -> None:
    script = Script(503, 503, [EXIT7])

    with pytest.raises(ReconnectBudgetExhausted):
        await follow(script, max_reconnects=1)

    assert len(script.afters) == 2


@pytest.mark.anyio
async def test_410_at_connect_is_fatal_without_reconnect() -> None:
    script = Script([data(1, b"a"), cut()], 410, [EXIT7])

    with pytest.raises(OutputEvicted):
        await follow(script)

    assert script.afters == [0, 1]


@pytest.mark.anyio
async def test_other_4xx_at_connect_is_re_raised() -> None:
    script = Script(404, [EXIT7])

    with pytest.raises(NotFound):
        await follow(script)

    assert script.afters == [0]


@pytest.mark.anyio
async def test_on_open_errors_propagate_and_are_not_reconnected() -> None:
    script = Script([EXIT7], [EXIT7])

    async def on_open() -> None:
        raise RuntimeError("gate upload failed")

    with pytest.raises(RuntimeError, match="gate upload failed"):
        await follow(script, on_open=on_open)

    assert script.afters == [0]


# ---------------------------------------------------------------- fatal frames


@pytest.mark.anyio
async def test_sequence_gap_is_fatal() -> None:
    script = Script([data(1, b"a"), data(3, b"c"), EXIT7])

    with pytest.raises(StreamGap, match="from seq 1 to 3"):
        await follow(script)


@pytest.mark.anyio
async def test_output_offset_expired_frame_is_eviction() -> None:
    frame = line({"type": "error", "error": "output_offset_expired", "oldest_available_seq": 9})
    script = Script([data(1, b"a"), frame], [EXIT7])

    with pytest.raises(OutputEvicted):
        await follow(script)

    assert script.afters == [0]


@pytest.mark.anyio
async def test_other_error_frames_are_fatal_and_never_echo_free_text() -> None:
    script = Script([line({"type": "error", "error": "boom: key sk-123 leaked"})])

    with pytest.raises(StreamError) as caught:
        await follow(script)

    assert "sk-123" not in str(caught.value)


@pytest.mark.anyio
async def test_exit_without_status_is_fatal() -> None:
    script = Script([line({"type": "exit"})])

    with pytest.raises(MissingExitStatus):
        await follow(script)


BAD_LINES = {
    "not-json": b"not json\n",
    "json-array": b"[1, 2]\n",
    "json-string": b'"data"\n',
    "unknown-type": line({"type": "stdout", "seq": 1}),
    "missing-type": line({"seq": 1}),
    "seq-bool": line({"type": "data", "seq": True, "stream": "stdout", "data_base64": ""}),
    "seq-zero": data(0, b"a"),
    "seq-fraction": data(1.5, b"a"),
    "seq-string": data("1", b"a"),
    "seq-too-big": data(2**53, b"a"),
    "stream-unknown": data(1, b"a", "tty"),  # pty frames are valid (terminal processes)
    "stream-missing": line({"type": "data", "seq": 1, "data_base64": "YQ=="}),
    "base64-unpadded": line({"type": "data", "seq": 1, "stream": "stdout", "data_base64": "YQ"}),
    "base64-newline": line({"type": "data", "seq": 1, "stream": "stdout", "data_base64": "YQ==\n"}),
    "base64-urlsafe": line({"type": "data", "seq": 1, "stream": "stdout", "data_base64": "-_8="}),
    "base64-missing": line({"type": "data", "seq": 1, "stream": "stdout"}),
    "too-long": b'{"type":"heartbeat"}' + b" " * (MAX_LINE_CHARS - 19) + b"\n",
}


@pytest.mark.anyio
@pytest.mark.parametrize("bad", BAD_LINES.values(), ids=BAD_LINES.keys())
async def test_malformed_lines_are_fatal(bad: bytes) -> None:
    script = Script([bad, EXIT7], [EXIT7])

    with pytest.raises(MalformedFrame):
        await follow(script)

    assert script.afters == [0]


@pytest.mark.anyio
async def test_line_of_exactly_the_limit_and_integral_float_seq_are_accepted() -> None:
    heartbeat = b'{"type":"heartbeat"}'
    padded = heartbeat + b" " * (MAX_LINE_CHARS - len(heartbeat)) + b"\n"
    script = Script([padded, data(1.0, b"a"), line({"type": "exit", "exit_code": 0.0})])

    frames = await follow(script)

    assert frames == [DataFrame(1, "stdout", b"a"), ExitFrame(0, None)]


@pytest.mark.anyio
async def test_exit_with_both_code_and_signal_keeps_both() -> None:
    script = Script([line({"type": "exit", "exit_code": 137, "signal": "SIGKILL"})])

    assert await follow(script) == [ExitFrame(137, "SIGKILL")]


@pytest.mark.anyio
async def test_frames_without_a_newline_stop_at_the_unterminated_tail_limit() -> None:
    parser = FrameParser()
    with pytest.raises(MalformedFrame):
        for _ in range(5):
            parser.feed(b"x" * MAX_LINE_CHARS)


# ---------------------------------------------------------------- parser properties


def test_parser_output_does_not_depend_on_chunk_boundaries() -> None:
    body = b"".join(
        [HEARTBEAT, data(1, "é€".encode()), b"\r\n", data(2, b"\x00\xff", "stderr"), EXIT7]
    )
    whole = FrameParser().feed(body)
    for split in range(1, len(body)):
        parser = FrameParser()
        frames = parser.feed(body[:split]) + parser.feed(body[split:])
        assert frames == whole
    byte_by_byte = FrameParser()
    assert [f for i in range(len(body)) for f in byte_by_byte.feed(body[i : i + 1])] == whole


def parses(payload: str) -> bool:
    frame = {"type": "data", "seq": 1, "stream": "stdout", "data_base64": payload}
    try:
        FrameParser().feed(line(frame))
    except MalformedFrame:
        return False
    return True


@settings(max_examples=1000)
@given(st.text(alphabet="AB+/9=-_ \n\t\x00é€", max_size=14))
def test_base64_check_matches_the_spec_regex(text: str) -> None:
    assert parses(text) == (STRICT_B64.fullmatch(text) is not None)


@pytest.mark.parametrize(
    ("payload", "accepted"),
    [
        ("", True),
        ("QQ==", True),
        ("QR==", True),  # non-zero trailing bits: the regex allows them
        ("QUI=", True),
        ("QUJD", True),
        ("Q===", False),
        ("QQ=", False),
        ("QQ", False),
        ("=QQQ", False),
        ("QQ==QQ==", False),
        ("QQ=A", False),
        ("QU I=", False),
    ],
)
def test_base64_edge_cases(payload: str, accepted: bool) -> None:
    assert parses(payload) == accepted


def test_json_escapes_inside_base64_are_decoded_first() -> None:
    body = b'{"type":"data","seq":1,"stream":"stdout","data_base64":"\\/w\\u003d\\u003d"}\n'
    assert FrameParser().feed(body) == [DataFrame(1, "stdout", b"\xff")]


@given(st.binary(max_size=64))
def test_base64_round_trip_of_any_bytes(raw: bytes) -> None:
    assert FrameParser().feed(data(1, raw)) == [DataFrame(1, "stdout", raw)]


# ---------------------------------------------------------------- over a real socket


@pytest.mark.anyio
async def test_real_http_cut_mid_stream_reconnects_without_duplicates(
    httpserver: HTTPServer,
) -> None:
    afters: list[str] = []

    def handler(request: Request) -> Response:
        afters.append(request.args["after"])

        full = data(1, b"one") + data(2, b"two") + EXIT7

        def body() -> Any:
            if len(afters) == 1:  # promise the whole body, send 1.5 frames, drop the socket
                yield full[: len(data(1, b"one")) + 20]
                raise ConnectionAbortedError("scripted cut")
            yield full

        headers = {"Content-Length": str(len(full))}
        return Response(body(), content_type="application/x-ndjson", headers=headers)

    httpserver.expect_request(f"/v1/sandboxes/{SB}/processes/{PROC}/connect").respond_with_handler(
        handler
    )
    origin = httpserver.url_for("/").rstrip("/")
    async with CreateOSClient(origin, "key", pacer=RequestPacer(origin, interval=0)) as client:
        frames = [f async for f in follow_process_output(client, SB, PROC, reconnect_delay=0)]

    assert afters == ["0", "1"]
    assert frames == [
        DataFrame(1, "stdout", b"one"),
        DataFrame(2, "stdout", b"two"),
        ExitFrame(7, None),
    ]


@pytest.mark.anyio
async def test_truncated_last_line_at_a_clean_eof_is_malformed_not_a_reconnect() -> None:
    script = Script([data(1, b"a"), b'{"type": "da'], [EXIT7])

    with pytest.raises(MalformedFrame):
        await follow(script)

    assert script.afters == [0]
