"""Identifier rules, payload conversion, error mapping and retry timing (pure functions)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from provider.createos.errors import (
    APIProtocolError,
    APIStatusError,
    AuthError,
    Conflict,
    NotFound,
    OutputEvicted,
    RateLimited,
    ServerError,
    status_error,
)
from provider.createos.models import (
    SANDBOX_STATES,
    ExecResult,
    exec_result,
    is_valid_id,
    process_view,
    sandbox_view,
)
from provider.createos.retry import MAX_BACKOFF, backoff_delay, parse_retry_after
from provider.errors import ProviderError


@pytest.mark.parametrize(
    "value", ["sb_01J8ZABCDEFGHJKMNPQRSTVWXY", "sb-01J8Z", "proc_1", "a", "-", "x" * 200]
)
def test_valid_ids(value: str) -> None:
    assert is_valid_id(value)


@pytest.mark.parametrize(
    "value", ["", "x" * 201, "sb/1", "sb.1", "sb 1", "sb\n", "\u017fb", None, 5, b"sb_1"]
)
def test_invalid_ids(value: Any) -> None:
    assert not is_valid_id(value)


def test_the_ten_sandbox_states() -> None:
    assert len(SANDBOX_STATES) == 10
    assert {"running", "paused", "destroyed", "failed", "forking"} <= SANDBOX_STATES
    assert "stopped" not in SANDBOX_STATES


def test_sandbox_view_keeps_the_timestamps_the_reaper_orders_by() -> None:
    data = {"id": "sb_1", "status": "paused", "created_at": "2026-09-20T10:00:00Z"}
    view = sandbox_view({**data, "paused_at": "2026-09-20T11:00:00.123Z"}, "op")
    assert (view.created_at, view.paused_at) == ("2026-09-20T10:00:00Z", "2026-09-20T11:00:00.123Z")
    assert sandbox_view({"id": "sb_1", "status": "paused"}, "op").paused_at is None
    odd = sandbox_view({**data, "paused_at": 1758369600}, "op")  # never fails a whole listing
    assert odd.paused_at == 1758369600


@pytest.mark.parametrize(
    ("envs", "keys"),
    [
        (["A", "PAPERCLIP_CREATEOS_FORK_1"], {"A", "PAPERCLIP_CREATEOS_FORK_1"}),
        ({"A": "***", "B": None}, {"A", "B"}),  # an object with hidden values
        (["A", 3, None], {"A"}),
        ("A", set()),
        (None, set()),
        (7, set()),
    ],
)
def test_sandbox_view_env_keys_read_names_only_and_never_fail(envs: Any, keys: set[str]) -> None:
    view = sandbox_view({"id": "sb_1", "status": "running", "envs": envs}, "op")
    assert view.env_keys == keys


def test_sandbox_view_ignores_unknown_fields_and_refuses_bad_ids() -> None:
    view = sandbox_view({"id": "sb_1", "status": "running", "vcpu": 1, "envs": ["A"]}, "op")
    assert (view.id, view.status, view.region) == ("sb_1", "running", None)
    with pytest.raises(APIProtocolError, match="invalid sandbox id"):
        sandbox_view({"id": "a/b", "status": "running"}, "op")
    with pytest.raises(APIProtocolError):
        sandbox_view({"id": "sb_1"}, "op")


def test_process_view_is_strict_about_types() -> None:
    with pytest.raises(APIProtocolError):
        process_view({"process_id": "p", "state": "exited", "exit_code": "7"}, "op")
    with pytest.raises(APIProtocolError):
        process_view({"process_id": "p", "state": "exited", "tree_exited": 1}, "op")
    view = process_view({"process_id": "p", "state": "exited", "tree_exited": True}, "op")
    assert view.tree_exited


@pytest.mark.parametrize(
    ("output", "newest"),
    [
        ({"oldest_seq": 1, "newest_seq": 17, "bytes": 5120}, 17),
        ({"newest_seq": 0}, 0),
        ({"newest_seq": "17"}, None),
        ({"newest_seq": True}, None),
        ({"newest_seq": -1}, None),
        ("17", None),
        (None, None),
    ],
)
def test_process_view_reads_the_newest_seq_leniently(output: Any, newest: int | None) -> None:
    view = process_view({"process_id": "p", "state": "running", "output": output}, "op")
    assert view.newest_seq == newest
    assert view.running


def test_exec_result_accepts_the_older_flat_shape() -> None:
    flat = {"stdout": "a", "stderr": "b", "exit_code": 3}
    assert exec_result(flat, "op") == ExecResult("a", "b", 3, None)
    with pytest.raises(APIProtocolError, match="exit code"):
        exec_result({"result": {"stdout": ""}}, "op")


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (401, AuthError),
        (403, AuthError),
        (404, NotFound),
        (409, Conflict),
        (410, OutputEvicted),
        (429, RateLimited),
        (500, ServerError),
        (503, ServerError),
        (400, APIStatusError),
        (402, APIStatusError),
    ],
)
def test_status_errors_map_to_their_class_and_name_op_and_status(
    status: int, kind: type[APIStatusError]
) -> None:
    error = status_error("create sandbox", status, retry_after=2.0)
    assert type(error) is kind
    assert isinstance(error, ProviderError)
    assert (error.status, error.operation, error.retry_after) == (status, "create sandbox", 2.0)
    assert "create sandbox" in str(error) and f"HTTP {status}" in str(error)


def test_retry_after_forms() -> None:
    now = datetime(2026, 9, 20, 10, 0, 0, tzinfo=UTC)
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert (
        parse_retry_after(format_datetime(now + timedelta(seconds=42), usegmt=True), now=now) == 42
    )
    assert (
        parse_retry_after(format_datetime(now - timedelta(seconds=42), usegmt=True), now=now) == 0
    )
    for junk in (None, "", "soon", "-3", "1e9999", "Mon, 99 Foo 2026"):
        assert parse_retry_after(junk) is None


def test_backoff_grows_exponentially_with_jitter_and_is_capped() -> None:
    def no_jitter(low: float, high: float) -> float:
        return low

    def full_jitter(low: float, high: float) -> float:
        return high

    assert [backoff_delay(n, 0.5, None, jitter=no_jitter) for n in range(3)] == [0.5, 1.0, 2.0]
    assert backoff_delay(0, 0.5, None, jitter=full_jitter) == 1.0
    assert backoff_delay(10, 0.5, None, jitter=full_jitter) == MAX_BACKOFF
    assert backoff_delay(0, 0.5, 9.0, jitter=full_jitter) == 9.0
