"""Responses are read 256 KiB at a time (the client core raises httpcore's 64 KiB default)."""

from __future__ import annotations

import httpcore
import pytest

from provider.createos import core


def test_http11_reads_are_widened_to_256_kib() -> None:
    assert core.HTTP11_READ_BYTES == 256 * 1024
    assert httpcore.AsyncHTTP11Connection.READ_NUM_BYTES == core.HTTP11_READ_BYTES


def test_widening_leaves_an_unexpected_default_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpcore.AsyncHTTP11Connection, "READ_NUM_BYTES", 128 * 1024)
    core._widen_http11_reads()
    assert httpcore.AsyncHTTP11Connection.READ_NUM_BYTES == 128 * 1024
