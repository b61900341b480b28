"""The standard-library handshake: which first lines it answers, and the method order."""

from __future__ import annotations

import os

import pytest

from provider.rpc.handshake import (
    ENVIRONMENT_METHOD_ORDER,
    initialize_request_id,
    read_first_line,
    supported_methods,
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}', 1),
        (b'{"jsonrpc":"2.0","id":"a","method":"initialize","params":{"config":{}}}', "a"),
        (b'{"jsonrpc":"2.0","id":1,"method":"health","params":{}}', None),
        (b'{"jsonrpc":"2.0","id":1,"method":"initialize"}', None),
        (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":[]}', None),
        (b'{"jsonrpc":"2.0","id":true,"method":"initialize","params":{}}', None),
        (b'{"jsonrpc":"2.0","id":null,"method":"initialize","params":{}}', None),
        (b'{"jsonrpc":"1.0","id":1,"method":"initialize","params":{}}', None),
        (b'{"jsonrpc":"2.0","method":"initialize","params":{}}', None),
        (b"[]", None),
        (b"{nope", None),
        (b"\xff", None),
        (b"", None),
    ],
)
def test_only_a_well_formed_initialize_is_answered_early(
    line: bytes, expected: int | str | None
) -> None:
    assert initialize_request_id(line) == expected


def test_supported_methods_keep_the_spec_order_and_drop_non_environment_names() -> None:
    names = ["health", "environmentSyncOut", "environmentCustom", "environmentValidateConfig"]
    assert supported_methods(names) == (
        "environmentValidateConfig",
        "environmentSyncOut",
        "environmentCustom",
    )
    assert supported_methods(reversed(ENVIRONMENT_METHOD_ORDER)) == ENVIRONMENT_METHOD_ORDER


def test_read_first_line_returns_what_follows_it() -> None:
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b'{"a":1}\n{"b":2}\npart')
        os.close(write_end)
        assert read_first_line(read_end) == (b'{"a":1}', b'{"b":2}\npart')
    finally:
        os.close(read_end)


def test_read_first_line_at_end_of_input() -> None:
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"no newline")
        os.close(write_end)
        assert read_first_line(read_end) == (b"no newline", b"")
    finally:
        os.close(read_end)
