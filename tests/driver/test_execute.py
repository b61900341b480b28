"""environmentExecute against the emulator: real processes, real streams, scripted faults."""

from __future__ import annotations

import anyio
import pytest

from provider.driver.commands.output import LIVE_CHUNK_MAX
from provider.errors import ProviderError, RequestRefused
from tests.driver.conftest import Harness
from tests.driver.stream_helpers import run, token_carriers

pytestmark = pytest.mark.anyio


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
    assert await token_carriers(h, lease) == []
    left = await run(h, lease, "bash", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert "sleep 30" not in left["stdout"], "a setsid'd grandchild outlived the timeout kill"


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
