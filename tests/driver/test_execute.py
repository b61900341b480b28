"""environmentExecute against the emulator: real processes, real streams, scripted faults."""

from __future__ import annotations

import base64
import json
from typing import Any

import anyio
import httpx
import pytest

from provider.driver.output import LIVE_CHUNK_MAX
from provider.errors import CleanupUnconfirmed, ProviderError, RequestRefused
from tests.driver.conftest import Harness

pytestmark = pytest.mark.anyio


async def run(h: Harness, lease: dict[str, Any], command: str, *args: str, **extra: Any) -> Any:
    return await h.methods.execute(
        {**h.with_lease(lease), "command": command, "args": list(args), **extra}
    )


def frame(seq: int, stream: str, data: bytes) -> str:
    return json.dumps(
        {
            "type": "data",
            "seq": seq,
            "stream": stream,
            "data_base64": base64.b64encode(data).decode(),
        }
    )


async def process_requests(h: Harness) -> list[dict[str, Any]]:
    return [r for r in await h.emulator.admin.requests() if "/processes" in r["path"]]


async def test_hostile_argv_env_and_cwd_arrive_verbatim(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    hostile = [
        "a'; touch /tmp/bad; echo '",
        "$(touch /tmp/bad)",
        "two words",
        "line\nbreak",
        "`id`",
    ]
    await run(h, lease, "mkdir", "-p", "/paperclip-workspace/my dir")
    result = await run(
        h,
        lease,
        "bash",
        "-c",
        'printf "[%s]" "$@"; printf "|%s|%s" "$MESSAGE" "$PWD"',
        "argv0",
        *hostile,
        env={"MESSAGE": "$(touch /tmp/bad) 'q' \"d\""},
        cwd="/paperclip-workspace/my dir",
    )
    assert result["exitCode"] == 0, result
    expected = "".join(f"[{a}]" for a in hostile)
    expected += "|$(touch /tmp/bad) 'q' \"d\"|/paperclip-workspace/my dir"
    assert result["stdout"] == expected
    check = await run(h, lease, "ls", "/tmp/bad")
    assert check["exitCode"] != 0  # nothing was ever evaluated


async def test_process_request_is_bash_with_cwd_and_no_env_field(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    await run(h, lease, "true", env={"SECRET_VALUE": "s3cret"}, cwd="/paperclip-workspace")
    async with httpx.AsyncClient(base_url=h.emulator.base_url) as http:
        answer = await http.get(
            f"/v1/sandboxes/{lease['providerLeaseId']}/processes",
            headers={"X-Api-Key": "test-key"},
        )
    (process,) = answer.json()["data"]["processes"]
    assert process["cmd"] == "/bin/bash" and process["args"][0] == "-lc"
    assert process["cwd"] == "/paperclip-workspace"
    assert "s3cret" in process["args"][1]  # per-command variables travel inside the script
    assert all("/input" not in r["path"] for r in await process_requests(h))


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


async def test_stdin_arrives_exactly_then_eof_and_nothing_is_left_staged(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    exact = "no newline at the end €"
    result = await run(h, lease, "bash", "-c", "cat; echo '|eof'", stdin=exact)
    assert result["stdout"] == exact + "|eof\n"
    empty = await run(h, lease, "cat", stdin="")
    assert empty["stdout"] == "" and empty["exitCode"] == 0
    no_stdin = await run(h, lease, "cat")
    assert no_stdin["stdout"] == "" and no_stdin["exitCode"] == 0  # reads EOF, never hangs
    big = await run(h, lease, "wc", "-c", stdin="y" * (300 * 1024))
    assert big["stdout"].strip() == str(300 * 1024)
    leftovers = await run(h, lease, "bash", "-c", "ls -a /tmp | grep -c paperclip- || true")
    assert leftovers["stdout"] == "0\n"  # the staged and drained stdin files are gone
    stdin_fd = await run(h, lease, "bash", "-c", "ls -l /proc/self/fd/0", stdin="z")
    assert "(deleted)" in stdin_fd["stdout"]  # unlinked before the command even started


async def test_output_larger_than_the_journal_written_at_once_is_complete(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    await h.emulator.admin.settings(journal_bytes=64 * 1024)
    size = 1024 * 1024  # 16x the journal, printed the instant the command starts
    result = await run(h, lease, "head", "-c", str(size), "/dev/zero")
    assert result["exitCode"] == 0
    assert len(result["stdout"]) == size


async def test_stdout_and_stderr_stay_separate_and_stream_in_order(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    script = "echo one; sleep 0.2; echo warn >&2; sleep 0.2; echo two; exit 7"
    result = await run(h, lease, "bash", "-c", script)
    assert result["exitCode"] == 7 and result["timedOut"] is False
    assert result["stdout"] == "one\ntwo\n" and result["stderr"] == "warn\n"
    assert h.live_chunks() == [("stdout", "one\n"), ("stderr", "warn\n"), ("stdout", "two\n")]
    assert result["metadata"]["outputTruncated"] is False
    assert result["metadata"]["processId"].startswith("proc_")


async def test_utf8_split_across_frames_comes_out_whole(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    result = await run(h, lease, "bash", "-c", r"printf '\xe2'; sleep 0.3; printf '\x82\xac'")
    assert result["stdout"] == "€"
    assert h.live_chunks() == [("stdout", "€")]


async def test_signal_death_reports_signal_name(harness: Harness) -> None:
    lease = await harness.acquire()
    result = await run(harness, lease, "bash", "-c", "kill -KILL $$")
    assert result["exitCode"] is None and result["signal"] == "SIGKILL"


@pytest.mark.slow
async def test_large_output_keeps_a_4mi_tail(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    script = "for i in $(seq 1 200000); do printf '%099d\\n' $i; done"  # 20,000,000 chars
    result = await run(h, lease, "bash", "-c", script)
    assert result["exitCode"] == 0
    assert len(result["stdout"]) == 4 * 1024 * 1024
    assert result["stdout"].endswith(f"{200000:099d}\n")
    assert result["metadata"]["outputTruncated"] is True
    live = "".join(chunk for stream, chunk in h.live_chunks() if stream == "stdout")
    assert len(live) == 20_000_000  # every character was streamed live, in order
    assert all(0 < len(chunk) <= LIVE_CHUNK_MAX for _, chunk in h.live_chunks())  # ASCII


async def test_timeout_returns_partial_output_and_kills_the_tree(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    script = (
        "echo partial; (sleep 300 &); setsid sleep 301 & "
        "(setsid bash -c 'exec sleep 302' &); sleep 300"
    )
    result = await run(h, lease, "bash", "-c", script, timeoutMs=1500)
    assert result["timedOut"] is True and result["exitCode"] is None
    assert "signal" not in result
    assert result["stdout"] == "partial\n"
    assert await h.emulator.admin.live_process_count() == 0
    left = await run(h, lease, "bash", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert "sleep 30" not in left["stdout"], "a setsid'd grandchild outlived the timeout kill"
    deletes = [r for r in await process_requests(h) if r["method"] == "DELETE"]
    assert len(deletes) == 1 and "grace_ms=1000" in deletes[0]["query"]


async def test_bad_env_name_and_empty_command_are_refused_before_any_request(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    before = await h.request_count()
    with pytest.raises(RequestRefused, match="BAD;KEY"):
        await run(h, lease, "true", env={"BAD;KEY": "x"})
    with pytest.raises(RequestRefused):
        await run(h, lease, "")
    with pytest.raises(RequestRefused):
        await run(h, lease, "echo", "nul\0byte")
    assert await h.request_count() == before


async def test_stream_cut_reconnects_without_duplicates(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    await h.emulator.admin.add_fault("GET", r"/connect$", cut_after_frames=1)
    script = r"printf '\xe2'; sleep 0.3; printf '\x82\xac'; sleep 0.2; echo warning >&2; exit 7"
    result = await run(h, lease, "bash", "-c", script)
    assert result["exitCode"] == 7
    assert result["stdout"] == "€" and result["stderr"] == "warning\n"
    assert h.live_chunks() == [("stdout", "€"), ("stderr", "warning\n")]
    connects = [r for r in await process_requests(h) if r["path"].endswith("/connect")]
    assert [r["query"] for r in connects] == ["after=0", "after=1"]
    creates = [
        r
        for r in await process_requests(h)
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
    await h.emulator.admin.add_fault("GET", r"/connect$", stream_lines=lines)
    with pytest.raises(ProviderError, match=f"(?i){message}"):
        await run(h, lease, "sleep", "30")
    deletes = [r for r in await process_requests(h) if r["method"] == "DELETE"]
    assert len(deletes) == 1 and "grace_ms=1000" in deletes[0]["query"]
    assert await h.emulator.admin.live_process_count() == 0


async def test_410_at_connect_fails_and_kills(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    await h.emulator.admin.add_fault("GET", r"/connect$", status=410)
    with pytest.raises(ProviderError, match="410"):
        await run(h, lease, "sleep", "30")
    assert await h.emulator.admin.live_process_count() == 0


async def test_reconnect_budget_is_four_attempts(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    await h.emulator.admin.add_fault("GET", r"/connect$", times=4, status=503)
    with pytest.raises(ProviderError):
        await run(h, lease, "sleep", "30")
    connects = [r for r in await process_requests(h) if r["path"].endswith("/connect")]
    assert len(connects) == 4
    assert await h.emulator.admin.live_process_count() == 0


async def test_unconfirmed_kill_poisons_the_lease_until_destroy(harness: Harness) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
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
    await h.emulator.admin.add_fault("POST", r"/processes$", status=502)
    with pytest.raises(CleanupUnconfirmed):
        await run(h, lease, "true")
    creates = [
        r
        for r in await process_requests(h)
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


async def test_shutdown_cancels_the_command_and_leaves_the_sandbox(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    errors: list[BaseException] = []

    async def long_command() -> None:
        try:
            await run(h, lease, "bash", "-c", "echo started; (sleep 300 &); sleep 300")
        except ProviderError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(long_command)
        with anyio.fail_after(20):
            while ("stdout", "started\n") not in h.live_chunks():
                await anyio.sleep(0.05)
        await h.methods.shutdown()
    assert len(errors) == 1 and "cancelled" in str(errors[0])
    assert await h.emulator.admin.live_process_count() == 0
    state = await h.emulator.admin.state()
    assert [s["status"] for s in state["sandboxes"]] == ["running"]
