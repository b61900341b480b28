"""Login terminals and duplex channels through the REAL Paperclip worker manager (checklist 80).

The manager's own routes drive the worker (``openLoginPtySession``, ``openDuplexChannel``), so
its binding, pair routing and close-acknowledgement checks (docs/protocol.md H10.2-H10.3) judge
every frame: a frame for a pair it never bound or a close answer it does not accept makes it
kill the worker. Each test therefore ends by proving the worker was not retired: the same shim
and Python processes, no exit or crash event, no "retiring worker" log line, and a call that
still works. The worker's call log (``PAPERCLIP_CREATEOS_CALL_LOG``) shows which requests the
host sent and that each was answered with a result, not an error.

The worker paces its requests with the real token bucket, so the tests keep request counts low.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from devtools.call_params import environment_call
from devtools.host_peer import HostPeer
from devtools.peer_sessions import PeerCallError, SessionExit, SessionTarget
from devtools.procfs import pid_alive
from provider.emulator import Emulator
from provider.rpc import wire
from tests.host.peer_helpers import CALL_TIMEOUT_MS

pytestmark = [pytest.mark.anyio, pytest.mark.host]

CALL_LOG_ENV = "PAPERCLIP_CREATEOS_CALL_LOG"
RETIRE_MARKERS = ("retiring worker", "not acknowledged", "ownership violation")

# A stand-in for the agent CLI's device login: prints the terminal size and a line with a "€"
# split across two writes, reads one line of input and echoes it, then exits 0. With the flood
# marker it prints without end once a line is typed (a login replays its output from the start:
# a flood before the worker attached would outrun the sandbox's output journal, a 410).
FAKE_CODEX = r"""#!/bin/bash
if [ -e /paperclip-workspace/codex-flood ]; then
  echo 'press enter'; IFS= read -r _; exec yes 'flood €'
fi
echo "size=$(stty size) args=$*"
printf 'price=5 \xe2'; sleep 0.3; printf '\x82\xac\n'
IFS= read -r line
printf 'got=<%s>\n' "$line"
exit 0
"""
# A stand-in for the host's HTTP/2 gateway: a readiness line on stdout, then a byte pipe.
FAKE_GATEWAY = r"""#!/bin/bash
printf 'gateway-ready port=%s nonce=%s\n' "$PAPERCLIP_BRIDGE_PORT" "$PAPERCLIP_BRIDGE_NONCE"
exec cat
"""
GATEWAY_PATH = "/paperclip-workspace/.paperclip-bridge/gateway.sh"


@dataclass
class Flow:
    """The manager with one started worker, the emulator, and what the worker was at start."""

    peer: HostPeer
    emulator: Emulator
    log_file: Path
    call_log: Path
    shim_pid: int
    worker_pid: int
    company_id: str = "company-interactive"
    environment_id: str = "env-interactive"

    def common(self) -> dict[str, Any]:
        return environment_call(
            self.emulator.base_url,
            "test-key",
            company_id=self.company_id,
            environment_id=self.environment_id,
            timeout_ms=60_000,
        )

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        return await self.peer.call(method, params, timeout_ms=CALL_TIMEOUT_MS)

    async def acquire(self, *, run: bool) -> dict[str, Any]:
        """A device login's fresh lease (``run`` False) or a heartbeat run's (True)."""
        extra = (
            {"runId": "run-1", "agentId": "agent-1", "executionWorkspaceId": "ws-1"} if run else {}
        )
        lease: dict[str, Any] = await self.call(
            "environmentAcquireLease", {**self.common(), **extra}
        )
        return lease

    def target(self, lease: dict[str, Any]) -> SessionTarget:
        return SessionTarget(self.company_id, self.environment_id, lease["providerLeaseId"])

    async def execute(
        self, lease: dict[str, Any], script: str, *, stdin: str | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {
            **self.common(),
            "lease": {**lease, "expiresAt": None},
            "command": "bash",
            "args": ["-c", script],
        }
        if stdin is not None:
            params["stdin"] = stdin
        result: dict[str, Any] = await self.call("environmentExecute", params)
        assert result["exitCode"] == 0, result
        return result

    async def install(self, lease: dict[str, Any], path: str, text: str) -> None:
        """Writes an executable file in the sandbox (``~`` expands there)."""
        await self.execute(
            lease, f'mkdir -p "$(dirname {path})" && cat > {path} && chmod +x {path}', stdin=text
        )

    async def release(self, lease: dict[str, Any]) -> None:
        assert await self.emulator.admin.live_process_count() == 0  # nothing outlived its route
        receipt = await self.call(
            "environmentReleaseLease",
            {
                **self.common(),
                "providerLeaseId": lease["providerLeaseId"],
                "leaseMetadata": lease["metadata"],
            },
        )
        assert receipt == {"providerLeaseId": lease["providerLeaseId"], "state": "destroyed"}

    def served(self, method: str) -> list[bool]:
        """The ``ok`` of every ``method`` request the worker answered, in order."""
        if not self.call_log.exists():
            return []
        lines = self.call_log.read_text().splitlines()
        return [entry["ok"] for entry in map(json.loads, lines) if entry["method"] == method]

    async def until_served(self, method: str, count: int, timeout: float = 10.0) -> list[bool]:
        # The worker appends a request's line just after writing its reply.
        with anyio.move_on_after(timeout):
            while len(self.served(method)) < count:
                await anyio.sleep(0.05)
        return self.served(method)

    async def assert_not_retired(self) -> None:
        """The host kept the very worker it started: no kill, no restart, still serving."""
        assert await self.call("health", {}) == {"status": "ok"}
        diagnostics = await self.peer.worker_diagnostics()
        assert diagnostics is not None
        assert diagnostics["status"] == "running"
        assert diagnostics["pid"] == self.shim_pid
        assert diagnostics["totalCrashes"] == 0
        assert self.peer.worker_pid() == self.worker_pid and pid_alive(self.worker_pid)
        assert [e for e in self.peer.events if e.type in ("exit", "crash")] == []
        log = self.log_file.read_text(errors="replace")
        for marker in RETIRE_MARKERS:
            assert marker not in log


@pytest.fixture
async def flow(emulator: Emulator, tmp_path: Path) -> AsyncIterator[Flow]:
    log_file = tmp_path / "peer.log"
    call_log = tmp_path / "calls.jsonl"
    async with HostPeer(log_file=log_file, cwd=tmp_path) as peer:
        await peer.start_worker(auto_restart=False, env={CALL_LOG_ENV: str(call_log)})
        shim_pid, worker_pid = peer.shim_pid(), peer.worker_pid()
        assert shim_pid is not None and worker_pid is not None
        yield Flow(peer, emulator, log_file, call_log, shim_pid, worker_pid)
        await peer.stop_worker()


def session_home() -> str:
    return f"/tmp/paperclip-adapter-login/{uuid.uuid4()}"


async def test_login_output_reaches_the_listener_and_the_exit_settles_the_wait(
    flow: Flow,
) -> None:
    lease = await flow.acquire(run=False)
    await flow.install(lease, "~/.local/bin/codex", FAKE_CODEX)
    login = await flow.peer.open_login_pty(
        flow.target(lease), login_command_key="codex", session_home=session_home()
    )
    prompt = await flow.peer.read_login_pty(login, contains="€\r\n", timeout_s=30)
    assert not prompt.timed_out and prompt.exit is None, prompt
    assert "size=30 120 args=login --device-auth" in prompt.text
    assert "price=5 €" in prompt.text  # the split character came out whole

    await flow.peer.write_login_pty(login, "typed ✓ input\r")  # Enter, as a terminal sends it
    assert await flow.peer.wait_session(login, timeout_s=30) == SessionExit(0)
    final = await flow.peer.read_login_pty(login)
    assert "got=<typed ✓ input>" in final.text  # the program read the line and echoed it
    assert final.text.startswith(prompt.text)
    assert "\ufffd" not in final.text

    await flow.peer.close_session(login)
    assert await flow.until_served("loginPtyClose", 1) == [True]
    assert flow.served("loginPtyOpen") == [True]
    assert flow.served("loginPtyInput") == [True]
    await flow.assert_not_retired()
    await flow.release(lease)


async def test_a_gateway_style_channel_round_trips_300_kib_exactly(flow: Flow) -> None:
    lease = await flow.acquire(run=True)
    await flow.install(lease, GATEWAY_PATH, FAKE_GATEWAY)
    nonce = "n'1 $HOME `x`"  # quoted by the host's own launcher, reinterpreted by nobody
    command = await flow.peer.gateway_argv(
        shell_command=lease["metadata"]["shellCommand"],
        remote_entrypoint=GATEWAY_PATH,
        node_command="bash",
        env={
            "PAPERCLIP_BRIDGE_HOST": "127.0.0.1",
            "PAPERCLIP_BRIDGE_PORT": "43123",
            "PAPERCLIP_BRIDGE_NONCE": nonce,
        },
    )
    assert command[:2] == ["bash", "-c"] and command[2].startswith("exec env PAPERCLIP_BRIDGE_")
    channel = await flow.peer.open_duplex_channel(flow.target(lease), command)
    ready = f"gateway-ready port=43123 nonce={nonce}\n".encode()
    greeting = await flow.peer.read_duplex_channel(channel, min_bytes=len(ready), timeout_s=30)
    assert greeting.data == ready and not greeting.timed_out  # stdout carries the child's only

    payload = os.urandom(300 * 1024)
    # 64 KiB writes, all in flight at once (within the host's 393,216 pending bytes): the
    # worker must keep them in order.
    await flow.peer.write_duplex_channel(channel, payload, chunk_bytes=64 * 1024)
    echoed = await flow.peer.read_duplex_channel(
        channel, offset=len(ready), min_bytes=len(ready) + len(payload), timeout_s=60
    )
    assert not echoed.timed_out and echoed.exit is None
    assert echoed.received == len(ready) + len(payload)
    assert echoed.data == payload
    assert await flow.until_served("duplexChannelWrite", 5) == [True] * 5

    await flow.peer.close_session(channel)
    assert await flow.peer.wait_session(channel) == SessionExit(None)  # a close ends the wait
    assert await flow.until_served("duplexChannelClose", 1) == [True]
    await flow.assert_not_retired()
    await flow.release(lease)


async def test_a_channel_whose_child_exits_3_settles_the_wait_and_closes_cleanly(
    flow: Flow,
) -> None:
    lease = await flow.acquire(run=True)
    channel = await flow.peer.open_duplex_channel(
        flow.target(lease), ["bash", "-c", "printf 'last words'; exit 3"]
    )
    assert await flow.peer.wait_session(channel, timeout_s=30) == SessionExit(3)
    seen = await flow.peer.read_duplex_channel(channel)
    assert seen.data == b"last words"  # the data came before the exit
    await flow.peer.close_session(channel)  # the worker still answers the bound pair
    assert await flow.until_served("duplexChannelClose", 1) == [True]
    await flow.assert_not_retired()
    await flow.release(lease)


async def test_a_kill_settles_each_wait_with_null_and_the_later_closes_are_acknowledged(
    flow: Flow,
) -> None:
    lease = await flow.acquire(run=False)
    await flow.install(lease, "~/.local/bin/codex", FAKE_CODEX)
    target = flow.target(lease)
    channel = await flow.peer.open_duplex_channel(target, ["sleep", "1000"])
    login = await flow.peer.open_login_pty(
        target, login_command_key="codex", session_home=session_home()
    )
    assert not (await flow.peer.read_login_pty(login, contains="price=5 €")).timed_out
    await flow.peer.kill_session(channel)  # duplexChannelStop, fire-and-forget
    await flow.peer.kill_session(login)  # loginPtyStop
    assert await flow.peer.wait_session(channel, timeout_s=30) == SessionExit(None)
    assert await flow.peer.wait_session(login, timeout_s=30) == SessionExit(None)
    assert await flow.until_served("duplexChannelStop", 1) == [True]
    assert await flow.until_served("loginPtyStop", 1) == [True]
    await flow.peer.close_session(channel)  # the ended pair is still answered in full
    await flow.peer.close_session(login)
    assert await flow.until_served("duplexChannelClose", 1) == [True]
    assert await flow.until_served("loginPtyClose", 1) == [True]
    await flow.assert_not_retired()
    await flow.release(lease)


async def test_failed_opens_reject_and_the_hosts_follow_up_closes_are_acknowledged(
    flow: Flow,
) -> None:
    lease = await flow.acquire(run=True)
    target = flow.target(lease)
    unknown = SessionTarget(flow.company_id, flow.environment_id, "sb-not-this-workers")
    with pytest.raises(PeerCallError, match="no such lease"):
        await flow.peer.open_duplex_channel(unknown, ["cat"])
    with pytest.raises(PeerCallError) as empty:
        await flow.peer.open_duplex_channel(target, [])
    assert empty.value.code == wire.INVALID_PARAMS and "non-empty" in empty.value.message
    with pytest.raises(PeerCallError, match="no such lease"):
        await flow.peer.open_login_pty(
            unknown, login_command_key="codex", session_home=session_home()
        )
    # Every failed open was followed by the host's close, which the worker answered.
    assert await flow.until_served("duplexChannelClose", 2) == [True, True]
    assert await flow.until_served("loginPtyClose", 1) == [True]
    assert flow.served("duplexChannelOpen") == [False, False]
    assert flow.served("loginPtyOpen") == [False]
    await flow.assert_not_retired()

    # The worker and its lease still work: a channel opens and echoes.
    channel = await flow.peer.open_duplex_channel(target, ["cat"])
    await flow.peer.write_duplex_channel(channel, b"still here")
    assert (await flow.peer.read_duplex_channel(channel, min_bytes=10)).data == b"still here"
    await flow.peer.close_session(channel)
    assert await flow.until_served("duplexChannelClose", 3) == [True] * 3
    await flow.assert_not_retired()
    await flow.release(lease)


async def test_closing_routes_while_output_streams_never_retires_the_worker(
    flow: Flow,
) -> None:
    lease = await flow.acquire(run=True)
    await flow.install(lease, "~/.local/bin/codex", FAKE_CODEX)
    await flow.execute(lease, "touch /paperclip-workspace/codex-flood")
    channel = await flow.peer.open_duplex_channel(
        flow.target(lease), ["bash", "-c", "exec yes"], keep_data=False
    )
    login = await flow.peer.open_login_pty(
        flow.target(lease), login_command_key="codex", session_home=session_home()
    )
    # Both stream at full speed; the worker keeps sending frames for both routes while the
    # host closes them (the host drops late frames of a closed pair).
    assert not (await flow.peer.read_login_pty(login, contains="press enter")).timed_out
    await flow.peer.write_login_pty(login, "\r")
    flooding = await flow.peer.read_duplex_channel(channel, min_bytes=1 << 20, timeout_s=60)
    assert not flooding.timed_out and flooding.exit is None
    flood = await flow.peer.read_login_pty(login, contains="flood €\r\nflood €", timeout_s=60)
    assert not flood.timed_out and flood.exit is None

    async with anyio.create_task_group() as group:
        group.start_soon(flow.peer.close_session, channel)
        group.start_soon(flow.peer.close_session, login)
    assert await flow.peer.wait_session(channel) == SessionExit(None)
    assert await flow.peer.wait_session(login) == SessionExit(None)
    assert await flow.until_served("duplexChannelClose", 1) == [True]
    assert await flow.until_served("loginPtyClose", 1) == [True]
    await anyio.sleep(0.5)  # any late frame of either pair has reached the host by now
    await flow.assert_not_retired()
    await flow.release(lease)
