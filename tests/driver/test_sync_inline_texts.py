"""The texts and the decoding of provider.driver.transfer.sync_inline, run by real bash against a
private root: the receive step takes exactly its run of stdin and refuses a short or bad one, the
pack command prints one small part inline and removes it, and the worker decodes only strict
base64 of exactly the announced size within the bound."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from provider.driver.commands.output import DEFAULT_TAIL_LIMIT
from provider.driver.commands.streamed import INLINE_STDIN_BYTES
from provider.driver.transfer import sync_inline, sync_parts
from provider.driver.transfer.sync_inline import INLINE_MARK, encode, encoded_length, parse_inline
from tests.driver.shell_helpers import make_tree, run_bash


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path)


def test_receive_takes_exactly_its_run_of_stdin(tmp_path: Path) -> None:
    first, second = b"\x00\xff\n\r" * 7, b"rest"
    a, b = tmp_path / "a", tmp_path / "b"
    script = "\n".join(
        [
            sync_inline.receive_text(str(a), len(first)),
            sync_inline.receive_text(str(b), len(second)),
            "cat",  # what is left of stdin
        ]
    )
    result = run_bash(script, stdin=(encode(first) + encode(second) + "tail").encode())
    assert result.returncode == 0, result.stderr
    assert a.read_bytes() == first and b.read_bytes() == second
    assert stat.S_IMODE(a.stat().st_mode) == 0o600  # private until placed
    assert result.stdout == b"tail"
    assert [encoded_length(n) for n in (0, 1, 2, 3, 4)] == [0, 4, 4, 4, 8]


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        (encode(b"abcdef")[:-4], b"arrived incomplete"),  # cut: 3 bytes of 6
        ("!!!!" + encode(b"ab"), b"could not be decoded"),
    ],
)
def test_receive_refuses_a_short_or_bad_run(tmp_path: Path, stdin: str, message: bytes) -> None:
    script = sync_inline.receive_text(str(tmp_path / "s"), 6) + "\necho placed"
    result = run_bash(script, stdin=stdin.encode())
    assert result.returncode == 1 and message in result.stderr
    assert b"placed" not in result.stdout


def test_pack_prints_a_small_part_inline_and_removes_it(tree: Path, tmp_path: Path) -> None:
    data = bytes(range(256)) * 16  # 4096 bytes
    (tree / "sub" / "f").write_bytes(data)
    scratch = tmp_path / "copy"
    source = str(tree / "sub" / "f")
    script = sync_parts._syncout_file_parts(source, str(scratch), 1 << 20, str(tree), 4096)
    result = run_bash(script)
    assert result.returncode == 0, result.stderr
    assert parse_inline(result.stdout.decode(), 4096) == data
    assert list(tmp_path.glob("copy*")) == []  # the pack command removed its scratch

    script = sync_parts._syncout_file_parts(source, str(scratch), 1 << 20, str(tree), 4095)
    result = run_bash(script)  # one byte over the bound: parts, to be fetched
    assert result.returncode == 0, result.stderr
    assert parse_inline(result.stdout.decode(), 4095) is None
    assert sync_parts.parse_part_sizes(result.stdout.decode()) == [4096]

    (tree / "empty").write_bytes(b"")
    script = sync_parts._syncout_file_parts(
        str(tree / "empty"), str(tmp_path / "e"), 1 << 20, str(tree), 1
    )
    result = run_bash(script)
    assert result.returncode == 0, result.stderr
    assert parse_inline(result.stdout.decode(), 1) == b""
    assert list(tmp_path.glob("e*")) == []


def test_pack_never_inlines_more_than_one_part(tree: Path, tmp_path: Path) -> None:
    (tree / "sub" / "f").write_bytes(b"x" * 10)
    source = str(tree / "sub" / "f")
    script = sync_parts._syncout_file_parts(source, str(tmp_path / "c"), 4, str(tree), 1 << 20)
    result = run_bash(script)
    assert result.returncode == 0, result.stderr
    assert parse_inline(result.stdout.decode(), 1 << 20) is None
    assert sync_parts.parse_part_sizes(result.stdout.decode()) == [4, 4, 2]


def block(size: int, text: str) -> str:
    return f"noise\n{INLINE_MARK} {size}\n{text}\n"


def test_parse_takes_the_last_block_and_checks_everything() -> None:
    assert parse_inline("no block here\n", 10) is None
    assert parse_inline(block(3, "YWJj") + block(2, "eHk="), 10) == b"xy"
    for stdout, problem in [
        (block(3, "YWJ"), "not valid base64"),  # unpadded
        (block(3, "YW Jj"), "not valid base64"),
        (block(3, "YWJj\x00"), "not valid base64"),
        (block(2, "YWJj"), "announced 2 bytes inline but printed 3"),
        (block(11, base64.b64encode(b"x" * 11).decode()), "over 10"),
    ]:
        with pytest.raises(ValueError, match=problem):
            parse_inline(stdout, 10)


def test_the_bounds_stay_within_the_exec_and_the_output_tail() -> None:
    assert sync_inline.INLINE_IN_CHARS <= INLINE_STDIN_BYTES  # one request inbound
    assert 2 * encoded_length(sync_inline.INLINE_OUT_BYTES) < DEFAULT_TAIL_LIMIT
