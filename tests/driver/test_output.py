"""Output decoding, the bounded tail buffer and live-chunk splitting."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provider.driver.output import (
    DEFAULT_TAIL_LIMIT,
    LiveBudget,
    StreamDecoder,
    TailBuffer,
    split_chunks,
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


def test_split_chunks_respects_max_len_and_keeps_order() -> None:
    text = "".join(chr(0x20 + i % 90) for i in range(1_234_567))
    pieces = split_chunks(text)
    assert [len(p) for p in pieces] == [500_000, 500_000, 234_567]
    assert "".join(pieces) == text


def test_split_chunks_small_and_empty() -> None:
    assert split_chunks("") == []
    assert split_chunks("abc") == ["abc"]
    assert split_chunks("€𝄞x", max_len=2) == ["€𝄞", "x"]


def test_split_chunks_never_separates_a_surrogate_pair() -> None:
    text = "ab\ud83d\ude00cd"
    pieces = split_chunks(text, max_len=3)
    assert "".join(pieces) == text
    assert pieces == ["ab", "\ud83d\ude00c", "d"]


@given(
    st.text(alphabet=st.sampled_from(["a", "€", "\ud83d", "\ude00", "𝄞"]), max_size=300),
    st.integers(min_value=2, max_value=50),
)
def test_split_chunks_property(text: str, max_len: int) -> None:
    pieces = split_chunks(text, max_len)
    assert "".join(pieces) == text
    assert all(0 < len(p) <= max_len for p in pieces)
    boundary = 0
    for piece in pieces[:-1]:
        boundary += len(piece)
        split_pair = (
            "\ud800" <= text[boundary - 1] <= "\udbff" and "\udc00" <= text[boundary] <= "\udfff"
        )
        assert not split_pair


def test_split_chunks_refuses_a_tiny_max_len() -> None:
    with pytest.raises(ValueError):
        split_chunks("abc", 1)


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
