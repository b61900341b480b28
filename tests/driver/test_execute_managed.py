"""environmentExecute on a CreateOS without the exec stream: managed processes (the fallback).

Each test first makes the emulator's origin answer 404 for the exec stream once
(:func:`use_managed_processes`), as an older server would; the worker then runs that origin's
commands as managed processes, which is what these tests pin: the request sequence, the
reconnecting output stream and its protocol checks, the tree kill by ``DELETE``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest

from provider.errors import CleanupUnconfirmed, ProviderError, RequestRefused
from tests.driver.conftest import Harness
from tests.driver.stream_helpers import run, use_managed_processes

pytestmark = pytest.mark.anyio


def frame(seq: int, stream: str, data: bytes) -> str:
    return json.dumps(
        {
            "type": "data",
            "seq": seq,
            "stream": stream,
            "data_base64": base64.b64encode(data).decode(),
        }
    )


async def process_requests(h: Harness, since: int = 0) -> list[dict[str, Any]]:
    requests = await h.emulator.admin.requests(since=since)
    return [r for r in requests if "/processes" in r["path"]]


async def test_process_request_is_bash_with_cwd_and_no_env_field(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    since = await use_managed_processes(h, lease)
    await run(h, lease, "true", env={"SECRET_VALUE": "s3cret"}, cwd="/paperclip-workspace")
    async with httpx.AsyncClient(base_url=h.emulator.base_url) as http:
        answer = await http.get(
            f"/v1/sandboxes/{lease['providerLeaseId']}/processes",
            headers={"X-Api-Key": "test-key"},
        )
    process = answer.json()["data"]["processes"][-1]  # after the first command's
    assert process["cmd"] == "/bin/bash" and process["args"][0] == "-lc"
    assert process["cwd"] == "/paperclip-workspace"
    assert "s3cret" in process["args"][1]  # per-command variables travel inside the script
    assert all("/input" not in r["path"] for r in await process_requests(h, since))


async def _requests_of(h: Harness, lease: dict[str, Any], *args: str, **extra: Any) -> Any:
    """Run one command; answer (its result, the (method, path tail) of every request it made)."""
    seen = max([0, *(r["seq"] for r in await h.emulator.admin.requests())])
    result = await run(h, lease, *args, **extra)
    prefix = f"/v1/sandboxes/{lease['providerLeaseId']}"
    made = [
        (r["method"], r["path"].removeprefix(prefix))
        for r in await h.emulator.admin.requests(since=seen)
    ]
    return result, made


def _shape(made: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Requests with process ids replaced, so sequences compare."""
    out = []
    for method, path in made:
        parts = ["{pid}" if p.startswith("proc_") else p for p in path.split("/")]
        out.append((method, "/".join(parts)))
    return out


async def test_a_command_costs_three_requests_with_or_without_small_stdin(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    await use_managed_processes(h, lease)
    result, made = await _requests_of(h, lease, "echo", "hi")
    assert result["stdout"] == "hi\n" and result["exitCode"] == 0
    assert _shape(made) == [
        ("POST", "/processes"),
        ("GET", "/processes/{pid}/connect"),
        ("POST", "/processes/{pid}/stdin/close"),
    ]
    text = "line one\nzwei €\n" * 1000
    result, made = await _requests_of(h, lease, "cat", stdin=text)
    assert result["stdout"] == text
    assert _shape(made) == [
        ("POST", "/processes"),
        ("GET", "/processes/{pid}/connect"),
        ("POST", "/processes/{pid}/input"),  # its exact length is the gate: no close
    ]
    big = "x" * (256 * 1024) + "€\n"  # over one /input request: staged as a file instead
    result, made = await _requests_of(h, lease, "cat", stdin=big)
    assert result["stdout"] == big
    assert [m for m, _ in _shape(made)] == ["PUT", "POST", "GET", "POST"]
    assert _shape(made)[0][1].startswith("/files")


async def test_stream_cut_reconnects_without_duplicates(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    since = await use_managed_processes(h, lease)
    await h.emulator.admin.add_fault("GET", r"/connect$", cut_after_frames=1)
    script = r"printf '\xe2'; sleep 0.3; printf '\x82\xac'; sleep 0.2; echo warning >&2; exit 7"
    result = await run(h, lease, "bash", "-c", script)
    assert result["exitCode"] == 7
    assert result["stdout"] == "€" and result["stderr"] == "warning\n"
    assert h.live_chunks() == [("stdout", "€"), ("stderr", "warning\n")]
    connects = [r for r in await process_requests(h, since) if r["path"].endswith("/connect")]
    assert [r["query"] for r in connects] == ["after=0", "after=1"]
    creates = [
        r
        for r in await process_requests(h, since)
        if r["method"] == "POST" and r["path"].endswith("/processes")
    ]
    assert len(creates) == 1


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([frame(1, "stdout", b"a"), frame(3, "stdout", b"b")], "gap|seq"),
        (["{not json"], "malformed|frame|JSON"),
        ([frame(1, "stdout", b"a"), json.dumps({"type": "exit"})], "exit"),
        (
            [
                json.dumps(
                    {"type": "error", "error": "output_offset_expired", "oldest_available_seq": 9}
                )
            ],
            "evict|dropped|expired",
        ),
    ],
    ids=["gap", "malformed", "exit-without-status", "eviction-frame"],
)
async def test_protocol_failures_fail_closed_and_kill_the_process(
    harness: Harness, lines: list[str], message: str
) -> None:
    h = harness
    lease = await h.acquire()
    since = await use_managed_processes(h, lease)
    await h.emulator.admin.add_fault("GET", r"/connect$", stream_lines=lines)
    with pytest.raises(ProviderError, match=f"(?i){message}"):
        await run(h, lease, "sleep", "30")
    deletes = [r for r in await process_requests(h, since) if r["method"] == "DELETE"]
    assert len(deletes) == 1 and "grace_ms=1000" in deletes[0]["query"]
    assert await h.emulator.admin.live_process_count() == 0


async def test_410_at_connect_fails_and_kills(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    await use_managed_processes(h, lease)
    await h.emulator.admin.add_fault("GET", r"/connect$", status=410)
    with pytest.raises(ProviderError, match="410"):
        await run(h, lease, "sleep", "30")
    assert await h.emulator.admin.live_process_count() == 0


async def test_reconnect_budget_is_four_attempts(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    since = await use_managed_processes(h, lease)
    await h.emulator.admin.add_fault("GET", r"/connect$", times=4, status=503)
    with pytest.raises(ProviderError):
        await run(h, lease, "sleep", "30")
    connects = [r for r in await process_requests(h, since) if r["path"].endswith("/connect")]
    assert len(connects) == 4
    assert await h.emulator.admin.live_process_count() == 0


async def test_unconfirmed_kill_poisons_the_lease_until_destroy(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    await use_managed_processes(h, lease)
    await h.emulator.admin.add_fault("DELETE", r"/processes/[^/]+$", times=5, status=503)
    result_or_error: list[object] = []
    try:
        result_or_error.append(await run(h, lease, "sleep", "30", timeoutMs=500))
    except CleanupUnconfirmed as exc:
        result_or_error.append(exc)
    assert isinstance(result_or_error[0], CleanupUnconfirmed)
    await h.emulator.admin.clear_faults()
    with pytest.raises(RequestRefused, match=r"[Dd]estroy"):
        await run(h, lease, "true")
    with pytest.raises(RequestRefused, match=r"[Dd]estroy"):
        await h.methods.release(h.lease_ref(lease, reuseLease=True))
    receipt = await h.methods.destroy(h.lease_ref(lease, reuseLease=True))
    assert receipt is not None and receipt["state"] == "destroyed"


async def test_process_create_502_poisons_and_is_never_retried(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    since = await use_managed_processes(h, lease)
    await h.emulator.admin.add_fault("POST", r"/processes$", status=502)
    with pytest.raises(CleanupUnconfirmed):
        await run(h, lease, "true")
    creates = [
        r
        for r in await process_requests(h, since)
        if r["method"] == "POST" and r["path"].endswith("/processes")
    ]
    assert len(creates) == 1
    with pytest.raises(RequestRefused):
        await run(h, lease, "true")
    with pytest.raises(RequestRefused):
        await h.methods.sync_out({**h.with_lease(lease), "operations": []})
    assert len(h.methods.runtime.tracker.unconfirmed_scopes()) == 1
    receipt = await h.methods.destroy(h.lease_ref(lease))
    assert receipt is not None and receipt["state"] == "destroyed"
    assert h.methods.runtime.tracker.unconfirmed_scopes() == frozenset()


async def test_small_stdin_is_drained_into_an_unlinked_file_before_the_command(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    await use_managed_processes(h, lease)
    stdin_fd = await run(h, lease, "bash", "-c", "ls -l /proc/self/fd/0", stdin="z")
    assert "(deleted)" in stdin_fd["stdout"]  # unlinked before the command even started
    leftovers = await run(h, lease, "bash", "-c", "ls -a /tmp | grep -c paperclip- || true")
    assert leftovers["stdout"] == "0\n"
