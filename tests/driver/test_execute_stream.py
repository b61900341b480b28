"""environmentExecute as one streaming exec: request budgets, the token-named tree, lost streams.

The emulator takes the worst case of the real API here: the stream ends only when every holder
of the command's stdout and stderr has closed them, and a client that hangs up kills nothing.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from provider.createos.client import CreateOSClient
from provider.driver.commands.execute import CommandSpec, run_command
from provider.driver.commands.streamed import INLINE_STDIN_BYTES, CommandLost
from provider.errors import CleanupUnconfirmed, ProviderError, RequestRefused
from tests.driver.conftest import Harness
from tests.driver.stream_helpers import (
    last_seq,
    requests_of,
    requests_since,
    run,
    token_carriers,
)

pytestmark = pytest.mark.anyio

STREAM = ("POST", "/exec")


def execs(made: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [m for m in made if m == STREAM]


async def test_a_command_is_one_request_with_or_without_inline_stdin(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    result, made = await requests_of(h, lease, "echo", "hi")
    assert result["stdout"] == "hi\n" and result["exitCode"] == 0
    assert made == [STREAM]
    text = "line one\nzwei €\n" * 1000
    result, made = await requests_of(h, lease, "cat", stdin=text)
    assert result["stdout"] == text and made == [STREAM]
    near = "x" * (INLINE_STDIN_BYTES - 3) + "€"  # exactly the bound in UTF-8 bytes
    result, made = await requests_of(h, lease, "wc", "-c", stdin=near)
    assert result["stdout"].strip() == str(INLINE_STDIN_BYTES) and made == [STREAM]
    over = near + "!"  # one byte over: staged as a file first, 2 requests
    result, made = await requests_of(h, lease, "wc", "-c", stdin=over)
    assert result["stdout"].strip() == str(INLINE_STDIN_BYTES + 1)
    assert [m for m, _ in made] == ["PUT", "POST"] and made[0][1].startswith("/files")
    leftovers = await run(h, lease, "bash", "-c", "ls -a /tmp | grep -c paperclip-stdin || true")
    assert leftovers["stdout"] == "0\n"  # the staged file was unlinked by the wrapper


async def test_exit_codes_and_signals_come_through_the_wrapper(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    for code in (0, 1, 127, 128 + 9, 255):
        result = await run(h, lease, "bash", "-c", f"exit {code}")
        assert (result["exitCode"], result["signal"]) == (code, None)
    for name in ("TERM", "KILL", "SEGV"):
        result = await run(h, lease, "bash", "-c", f"echo x; kill -{name} $$")
        assert (result["exitCode"], result["signal"]) == (None, f"SIG{name}")
        assert result["stdout"] == "x\n"
    missing = await run(h, lease, "no-such-command-anywhere")
    assert missing["exitCode"] == 127 and "no-such-command-anywhere" in missing["stderr"]
    printed = await run(h, lease, "bash", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; exit 3")
    assert printed["exitCode"] == 3  # the wrapper's own text printed cannot end the stream early


async def test_timeout_kills_double_forked_and_setsid_children_in_one_request(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    script = (
        "echo partial; (sleep 300 &); setsid sleep 301 & "
        "(setsid bash -c '(exec sleep 302 &)' &); sleep 300"
    )
    result, made = await requests_of(h, lease, "bash", "-c", script, timeoutMs=1500)
    assert result["timedOut"] is True and result["exitCode"] is None
    assert result["stdout"] == "partial\n"
    assert made == [STREAM]  # the wrapper killed the tree itself: no extra request
    assert await token_carriers(h, lease) == []


async def test_a_daemon_holding_stdout_does_not_hold_the_command(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    script = "(sleep 120; echo late) & echo leader; exit 4"  # the child keeps stdout open
    result, made = await requests_of(h, lease, "bash", "-c", script, timeoutMs=60_000)
    assert result["exitCode"] == 4 and result["stdout"] == "leader\n"
    assert made == [STREAM]
    carriers = await token_carriers(h, lease)
    assert any("sleep 120" in line for line in carriers), carriers  # still running
    after = await run(h, lease, "echo", "next")
    assert after["stdout"] == "next\n"


async def test_release_mid_command_kills_the_tree_with_one_confirmed_kill(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    outcome: list[BaseException] = []
    seen = await last_seq(h)

    async def long_command() -> None:
        try:
            script = "(sleep 300 &); setsid sleep 301 & echo started; sleep 300"
            await h.methods.execute(
                {**h.with_lease(lease, reuseLease=True), "command": "bash", "args": ["-c", script]}
            )
        except ProviderError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(long_command)
        with anyio.fail_after(20):
            while ("stdout", "started\n") not in h.live_chunks():
                await anyio.sleep(0.02)
        ref = {**h.lease_ref(lease, reuseLease=True), "cancelActiveWork": True}
        receipt = await h.methods.release(ref)
    assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "stopped"}
    assert len(outcome) == 1 and "cancelled" in str(outcome[0])
    requests = await h.emulator.admin.requests(since=seen)
    exec_queries = [r["query"] for r in requests if r["path"].endswith("/exec")]
    assert exec_queries == ["stream=true", ""]  # the command, then one kill by its token
    async with httpx.AsyncClient(base_url=h.emulator.base_url) as http:  # look inside it
        answer = await http.post(
            f"/v1/sandboxes/{lease['providerLeaseId']}/resume", headers={"X-Api-Key": "test-key"}
        )
        assert answer.status_code < 300, answer.text
    with anyio.fail_after(20):
        while (await h.emulator.admin.state())["sandboxes"][0]["status"] != "running":
            await anyio.sleep(0.05)
    assert await token_carriers(h, lease) == []


async def test_a_cut_stream_is_a_clear_error_after_a_confirmed_kill(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    await h.emulator.admin.add_fault("POST", r"/exec$", cut_after_frames=1)
    seen = await last_seq(h)
    with pytest.raises(CommandLost, match="lost") as caught:
        await run(h, lease, "bash", "-c", "echo started; (sleep 300 &); sleep 300")
    assert "killed, confirmed" in str(caught.value) and "started" in str(caught.value)
    made = await requests_since(h, lease, seen)
    assert execs(made) == [STREAM, STREAM]  # the command and one kill
    assert await token_carriers(h, lease) == []
    after = await run(h, lease, "echo", "usable")  # the lease is not poisoned
    assert after["stdout"] == "usable\n"


async def test_a_cut_stream_whose_kill_fails_poisons_the_lease(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    await h.emulator.admin.add_fault("POST", r"/exec$", cut_after_frames=1)
    await h.emulator.admin.add_fault("POST", r"/exec$", status=500)  # the kill
    with pytest.raises(CleanupUnconfirmed):
        await run(h, lease, "bash", "-c", "echo started; sleep 300")
    with pytest.raises(RequestRefused, match=r"[Dd]estroy"):
        await run(h, lease, "true")
    receipt = await h.methods.destroy(h.lease_ref(lease))
    assert receipt is not None and receipt["state"] == "destroyed"


async def test_a_server_without_the_stream_falls_back_once_per_origin(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    await h.emulator.admin.settings(exec_stream=False)
    first, made = await requests_of(h, lease, "echo", "one")
    assert first["stdout"] == "one\n"
    assert [m for m, _ in made[:2]] == ["POST", "GET"]  # the 404, then the sandbox is there
    assert [m for m, p in made[2:]] == ["POST", "GET", "POST"]  # a managed process
    second, made = await requests_of(h, lease, "echo", "two")
    assert second["stdout"] == "two\n" and STREAM not in made and len(made) == 3
    said = [m for level, m in h.logs if "no exec stream" in m]
    assert len(said) == 1 and h.emulator.base_url in said[0]


def _result_keys(result: dict[str, Any]) -> set[str]:
    return set(result)


async def test_results_have_the_managed_paths_shape(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    done = await run(h, lease, "true")
    assert _result_keys(done) == {"exitCode", "signal", "timedOut", "stdout", "stderr", "metadata"}
    late = await run(h, lease, "sleep", "5", timeoutMs=200)
    assert _result_keys(late) == {"exitCode", "timedOut", "stdout", "stderr", "metadata"}
    assert late["metadata"] == {"outputTruncated": False}


def closed_connections_to(port: int) -> int:
    """Client-side TCP sockets to ``port`` in TIME_WAIT: connections this machine closed."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                count += remote_port == port and fields[3] == "06"
    return count


async def test_a_finished_command_gives_its_connection_back(harness: Harness) -> None:
    """Read to its end, the stream's connection goes back to the pool: the next command does
    not pay a new connection (with TLS, on CreateOS). Ten commands, no connection closed."""
    h = harness
    lease = await h.acquire()
    port = int(h.emulator.base_url.rsplit(":", 1)[1])
    async with CreateOSClient(h.emulator.base_url, "test-key") as client:
        await client.get_sandbox(lease["providerLeaseId"])  # the pool's one connection
        before = closed_connections_to(port)
        for _ in range(10):
            result = await run_command(
                client, lease["providerLeaseId"], CommandSpec("true"), on_output=None,
                cleanup_timeout=10,
            )  # fmt: skip
            assert result.exit_code == 0
        assert closed_connections_to(port) == before
