"""Output decoding, the bounded tail buffer, live chunks (UTF-16 bounds, coalescing), the budget."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provider.driver.commands.output import (
    DEFAULT_TAIL_LIMIT,
    LIVE_BUDGET,
    LIVE_CHUNK_MAX,
    LiveBudget,
    LiveQueue,
    StreamDecoder,
    TailBuffer,
    utf16_cut,
    utf16_len,
)


def truncated(tail: TailBuffer) -> bool:
    """Read the flag through a call so mypy does not keep an earlier narrowing."""
    return tail.truncated


def test_tail_default_limit_is_4_mi_characters() -> None:
    assert TailBuffer()._limit == DEFAULT_TAIL_LIMIT == 4_194_304


def test_tail_below_limit_keeps_everything() -> None:
    tail = TailBuffer(10)
    tail.append("abc")
    tail.append("")
    tail.append("defghij")
    assert tail.getvalue() == "abcdefghij"
    assert not tail.truncated


def test_tail_keeps_exactly_the_last_n_over_many_appends() -> None:
    tail = TailBuffer(1000)
    reference: list[str] = []
    rng = random.Random(7)
    for i in range(5000):
        piece = f"<{i}>" * rng.randint(0, 40)
        tail.append(piece)
        reference.append(piece)
        assert tail.held <= 2000
    expected = "".join(reference)[-1000:]
    assert tail.getvalue() == expected
    assert tail.truncated


def test_tail_one_huge_append() -> None:
    tail = TailBuffer(100)
    tail.append("x" * 10)
    tail.append("".join(chr(0x4E00 + i % 500) for i in range(100_000)))
    value = tail.getvalue()
    assert len(value) == 100
    assert value == "".join(chr(0x4E00 + i % 500) for i in range(100_000))[-100:]
    assert tail.truncated
    tail.append("end")
    assert tail.getvalue() == value[3:] + "end"


def test_tail_exactly_at_limit_is_not_truncated() -> None:
    tail = TailBuffer(8)
    tail.append("1234")
    tail.append("5678")
    assert not tail.truncated
    assert tail.getvalue() == "12345678"
    tail.append("9")
    assert truncated(tail)
    assert tail.getvalue() == "23456789"


def test_tail_memory_stays_within_twice_the_limit() -> None:
    limit = 4 * 1024 * 1024
    tail = TailBuffer(limit)
    piece = "0123456789abcdef" * 256  # 4 KiB
    total = 0
    peak = 0
    counter = 0
    while total < 20 * 1024 * 1024:
        counter += 1
        tail.append(piece[: 4000 + counter % 96])
        total += 4000 + counter % 96
        peak = max(peak, tail.held)
        held_chars = sum(len(p) for p in tail._pieces) + sum(len(p) for p in tail._run)
        assert held_chars == tail.held
    assert peak <= 2 * limit
    assert tail.total == total
    assert tail.truncated
    assert len(tail.getvalue()) == limit


def test_tail_of_tiny_appends_holds_few_string_objects() -> None:
    limit = 4 * 1024 * 1024
    tail = TailBuffer(limit)
    for i in range(3 * limit // 2):  # 6 Mi one-character frames (a progress dot per frame)
        tail.append("ab"[i % 2])
    # Each small run is joined into one piece: a few thousand objects, not millions.
    assert len(tail._pieces) + len(tail._run) <= limit // TailBuffer.SMALL_PIECES + 257
    assert tail.held < 2 * limit
    value = tail.getvalue()
    assert len(value) == limit and value.startswith("ab") and value.endswith("ab")


def test_decoder_joins_a_character_split_across_feeds() -> None:
    euro = "€".encode()
    decoder = StreamDecoder()
    assert decoder.feed(euro[:1]) == ""
    assert decoder.feed(euro[1:2]) == ""
    assert decoder.feed(euro[2:] + b"!") == "€!"
    assert decoder.flush() == ""


def test_decoder_replaces_invalid_bytes() -> None:
    decoder = StreamDecoder()
    assert decoder.feed(b"a\xffb\xc0\x80") == "a\ufffdb\ufffd\ufffd"


def test_decoder_flush_replaces_an_unfinished_character() -> None:
    decoder = StreamDecoder()
    assert decoder.feed("x€".encode()[:-1]) == "x"
    assert decoder.flush() == "\ufffd"


@given(st.text(), st.lists(st.integers(min_value=0, max_value=64), max_size=20))
def test_decoder_any_split_gives_the_same_text(text: str, cuts: list[int]) -> None:
    data = text.encode("utf-8", "surrogatepass") if not _has_surrogates(text) else b""
    expected = data.decode("utf-8", "replace")
    decoder = StreamDecoder()
    out: list[str] = []
    position = 0
    for cut in cuts:
        out.append(decoder.feed(data[position : position + cut]))
        position += cut
    out.append(decoder.feed(data[position:]))
    out.append(decoder.flush())
    assert "".join(out) == expected


def _has_surrogates(text: str) -> bool:
    return any("\ud800" <= ch <= "\udfff" for ch in text)


# --- UTF-16 sizes: what the host's chunk.length counts -------------------------------------


def test_utf16_len_counts_astral_characters_twice() -> None:
    assert utf16_len("") == 0
    assert utf16_len("abc") == 3
    assert utf16_len("é€✓") == 3
    assert utf16_len("😀𝄞") == 4
    assert utf16_len("a😀b") == 4


def test_utf16_cut_takes_the_longest_prefix_within_the_limit() -> None:
    assert utf16_cut("abcdef", 4) == 4
    assert utf16_cut("😀😀😀", 5) == 2  # never half of a character
    assert utf16_cut("😀😀😀", 1) == 0
    assert utf16_cut("a😀b", 2) == 1
    assert utf16_cut("a😀b", 3) == 2
    assert utf16_cut("xx😀😀", 3, start=2) == 3
    assert utf16_cut("abc", 10) == 3


@given(
    st.text(alphabet=st.sampled_from(["a", "é", "€", "😀", "𝄞"]), max_size=200),
    st.integers(min_value=0, max_value=60),
    st.integers(min_value=0, max_value=20),
)
def test_utf16_cut_property(text: str, limit: int, start: int) -> None:
    start = min(start, len(text))
    end = utf16_cut(text, limit, start)
    assert start <= end <= len(text)
    assert utf16_len(text[start:end]) <= limit
    if end < len(text):  # maximal: one more character would not fit
        assert utf16_len(text[start : end + 1]) > limit


# --- the live queue: chunks up to the host's limit, coalesced within one stream ------------


def _drain(queue: LiveQueue) -> list[tuple[str, str]]:
    taken: list[tuple[str, str]] = []
    while (chunk := queue.take()) is not None:
        taken.append(chunk)
    return taken


def test_the_chunk_limit_is_the_hosts_1_000_000_utf16_units() -> None:
    assert LIVE_CHUNK_MAX == 1_000_000
    assert LIVE_BUDGET == 128 * 1024 * 1024


def test_a_live_queue_refuses_a_limit_below_one_astral_character() -> None:
    with pytest.raises(ValueError):
        LiveQueue(max_units=1)


def test_a_lone_piece_goes_out_as_it_is() -> None:
    queue = LiveQueue()
    assert queue.take() is None
    text = "x" * 1000
    queue.push("stdout", text)
    assert queue.chars == 1000 and len(queue) == 1
    stream, chunk = queue.take() or ("", "")
    assert stream == "stdout" and chunk is text  # not copied
    assert queue.take() is None and queue.chars == 0


def test_pieces_of_one_stream_that_piled_up_are_merged_up_to_the_limit() -> None:
    queue = LiveQueue(max_units=10)
    for piece in ("abc", "def", "ghi", "jkl"):
        queue.push("stdout", piece)
    queue.push("stdout", "")  # ignored
    assert _drain(queue) == [("stdout", "abcdefghij"), ("stdout", "kl")]


def test_never_merged_across_a_change_of_stream() -> None:
    queue = LiveQueue(max_units=100)
    for stream, piece in [
        ("stdout", "o1"),
        ("stdout", "o2"),
        ("stderr", "e1"),
        ("stdout", "o3"),
        ("stderr", "e2"),
        ("stderr", "e3"),
    ]:
        queue.push(stream, piece)
    assert _drain(queue) == [
        ("stdout", "o1o2"),
        ("stderr", "e1"),
        ("stdout", "o3"),
        ("stderr", "e2e3"),
    ]


def test_a_piece_over_the_limit_is_cut_between_code_points() -> None:
    queue = LiveQueue(max_units=5)
    queue.push("stdout", "😀😀😀😀")  # 8 units
    queue.push("stdout", "ab")
    chunks = _drain(queue)
    assert chunks == [("stdout", "😀😀"), ("stdout", "😀😀a"), ("stdout", "b")]
    assert all(utf16_len(chunk) <= 5 for _, chunk in chunks)


def test_a_full_size_chunk_of_astral_text_is_500_000_characters() -> None:
    queue = LiveQueue()
    text = "😀" * 1_200_000
    for start in range(0, len(text), 100_000):
        queue.push("stderr", text[start : start + 100_000])
    chunks = [chunk for _, chunk in _drain(queue)]
    assert [len(chunk) for chunk in chunks] == [500_000, 500_000, 200_000]
    assert "".join(chunks) == text


def test_queued_ascii_frames_coalesce_into_full_million_unit_chunks() -> None:
    queue = LiveQueue()
    frame = "y" * 131_072
    for _ in range(20):
        queue.push("stdout", frame)
    chunks = [chunk for _, chunk in _drain(queue)]
    assert [len(chunk) for chunk in chunks] == [1_000_000, 1_000_000, 621_440]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["stdout", "stderr"]),
            st.text(alphabet=st.sampled_from(["a", "é", "€", "😀", "\n"]), max_size=40),
        ),
        max_size=40,
    ),
    st.integers(min_value=2, max_value=30),
    st.integers(min_value=0, max_value=40),
)
def test_live_queue_property(
    pushes: list[tuple[str, str]], max_units: int, take_every: int
) -> None:
    """Whatever the interleaving of pushes and takes: per stream the chunks are the output,
    the character order across streams is the arrival order, every chunk is non-empty and
    within the limit, and a chunk is only followed by one of its own stream when it is full."""
    queue = LiveQueue(max_units=max_units)
    chunks: list[tuple[str, str]] = []
    for index, (stream, text) in enumerate(pushes):
        queue.push(stream, text)
        if take_every and index % take_every == 0 and (chunk := queue.take()) is not None:
            chunks.append(chunk)
    chunks.extend(_drain(queue))
    assert queue.chars == 0 and len(queue) == 0
    flat_in = [(stream, char) for stream, text in pushes for char in text]
    flat_out = [(stream, char) for stream, text in chunks for char in text]
    assert flat_out == flat_in
    assert all(text and utf16_len(text) <= max_units for _, text in chunks)
    if not take_every:  # everything was queued before the first take: maximal merging
        for (stream, text), (next_stream, next_text) in itertools.pairwise(chunks):
            if stream == next_stream:
                assert utf16_len(text + next_text[0]) > max_units


def exhausted(budget: LiveBudget) -> bool:
    return budget.exhausted


def test_live_budget_stops_after_the_limit() -> None:
    budget = LiveBudget(10)
    assert budget.admit("12345") == "12345"
    assert not budget.exhausted
    assert budget.admit("67890") == "67890"
    assert not budget.exhausted
    assert budget.admit("x") == ""
    assert exhausted(budget)
    assert budget.sent == 10


def test_live_budget_cuts_a_piece_crossing_the_limit() -> None:
    budget = LiveBudget(4)
    assert budget.admit("abcdef") == "abcd"
    assert budget.exhausted
    assert budget.admit("g") == ""


def test_live_budget_default_is_128_mi() -> None:
    budget = LiveBudget()
    assert budget.admit("a" * 1000) == "a" * 1000
    assert budget._limit == 128 * 1024 * 1024


def test_live_budget_counts_utf16_units_and_leaves_no_gap() -> None:
    budget = LiveBudget(5)
    assert budget.admit("😀😀😀") == "😀😀"  # 4 units; a third would make 6
    assert budget.exhausted
    assert budget.sent == 4
    assert budget.admit("a") == ""  # it would fit the last unit, but after a hole
