"""Line framing (no length cap, LF/CRLF, blank lines) and the UTF-8 encoder."""

from __future__ import annotations

import json
import math

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from provider.rpc import wire
from provider.rpc.stdio import LineReader
from tests.rpc.harness import MemoryByteReceiveStream

pytestmark = pytest.mark.anyio


async def _lines(chunks: list[bytes]) -> list[bytes]:
    send, receive = anyio.create_memory_object_stream[bytes](math.inf)
    with send:
        for chunk in chunks:
            send.send_nowait(chunk)
    reader = LineReader(MemoryByteReceiveStream(receive))
    lines: list[bytes] = []
    with receive:
        while True:
            try:
                lines.append(await reader.receive_line())
            except anyio.EndOfStream:
                return lines


async def test_lf_crlf_blank_lines_and_a_final_unterminated_line() -> None:
    chunks = [b"one\n", b"two\r\n\n  \r\nthr", b"ee\nfour"]
    assert await _lines(chunks) == [b"one", b"two", b"three", b"four"]


async def test_crlf_split_across_chunks() -> None:
    assert await _lines([b"a\r", b"\nb\n"]) == [b"a", b"b"]


async def test_a_line_far_above_64_kib_arrives_whole() -> None:
    big = b'{"x":"' + b"y" * (5 * 1024 * 1024) + b'"}'
    chunks = [big[i : i + 65536] for i in range(0, len(big), 65536)] + [b"\nnext\n"]
    lines = await _lines(chunks)
    assert lines == [big, b"next"]


def _check_line(line: bytes) -> str:
    """A line as the host reads it: valid UTF-8, one LF at the end, no CR anywhere."""
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert b"\r" not in line
    return line.decode("utf-8")  # strict: raises on anything that is not UTF-8


def test_encoded_lines_are_utf8_single_lines_and_round_trip() -> None:
    message = {"s": "a\nb\r é € 😀 \u2028\u2029\x85 \x00\x1f \\u00e9", "n": [1, 2.5, None, True]}
    line = wire.encode_line(message)
    text = _check_line(line)
    assert json.loads(text) == message
    # Non-ASCII text goes out as its UTF-8 bytes, not as \\u escapes (2-3x shorter).
    assert "é € 😀".encode() in line
    assert b"\\u20ac" not in line and b"\\ud83d" not in line


def test_a_result_of_4_mi_astral_characters_per_stream_is_one_compact_line() -> None:
    big = "😀" * (4 * 1024 * 1024)
    line = wire.encode_line(wire.result_message(7, {"stdout": big, "stderr": big}))
    # 4 bytes per character, where \\ud83d\\ude00 escapes took 12: 32 MiB instead of 96 MiB.
    assert len(line) < 2 * 4 * len(big) + 100
    assert json.loads(_check_line(line))["result"]["stderr"] == big


def test_lone_surrogates_are_refused_never_written() -> None:
    for text in ("\ud800", "a\udc00b", "\ud83d\ude00"):  # the last: a pair as 2 code points
        with pytest.raises(UnicodeEncodeError):
            wire.encode_line({"t": text})


@given(st.text())
def test_any_text_round_trips_through_the_utf8_encoder(text: str) -> None:
    try:
        line = wire.encode_line({"t": text})
    except (UnicodeEncodeError, ValueError, TypeError):
        # lone surrogates cannot be UTF-8 encoded; the dispatcher turns this into an error reply
        assert any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)
        return
    assert json.loads(_check_line(line)) == {"t": text}


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ({"jsonrpc": "2.0", "id": 1, "method": "health", "params": {}}, wire.Request),
        ({"jsonrpc": "2.0", "id": "abc", "method": "health"}, wire.Request),
        ({"jsonrpc": "2.0", "method": "onEvent", "params": {}}, wire.Notification),
        ({"jsonrpc": "2.0", "id": 3, "result": None}, wire.Response),
        ({"jsonrpc": "2.0", "id": 3, "error": {"code": 1, "message": "m"}}, wire.Response),
        ({"jsonrpc": "2.0", "id": True, "method": "health"}, wire.Invalid),
        ({"jsonrpc": "2.0", "id": 3, "error": "nope"}, wire.Invalid),
        ({"jsonrpc": "2.0"}, wire.Invalid),
        ([], wire.Invalid),
    ],
)
def test_classification_by_shape(raw: object, kind: type) -> None:
    assert isinstance(wire.classify(raw), kind)


def test_invocation_id_is_read_from_the_paperclip_invocation_object() -> None:
    message = wire.classify(
        {
            "jsonrpc": "2.0",
            "id": 12,
            "method": "environmentExecute",
            "params": {},
            "paperclipInvocation": {"id": "i-9", "scope": {"companyId": "c1"}},
        }
    )
    assert isinstance(message, wire.Request)
    assert message.invocation_id == "i-9"
    assert message.has_params is True


def test_same_id_numbers_both_ways_are_told_apart_by_shape() -> None:
    ours = wire.classify({"jsonrpc": "2.0", "id": 1, "result": {"a": 1}})
    theirs = wire.classify({"jsonrpc": "2.0", "id": 1, "method": "health", "params": {}})
    assert isinstance(ours, wire.Response)
    assert isinstance(theirs, wire.Request)


def test_undecodable_line_is_a_parse_error() -> None:
    message = wire.decode_line(b"\xff{")
    assert isinstance(message, wire.Invalid)
    assert message.code == wire.PARSE_ERROR
    assert message.id is None
