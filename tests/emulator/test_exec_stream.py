"""The streamed exec (``/exec?stream=true``, docs/protocol.md C5): frames leave as the output is
produced, heartbeats fill silences, the stream ends at stdio EOF (not at the leader's exit), and a
client that hangs up does not kill the command.

Commands wait on a gate file the test creates through the files API, so every ordering below is
decided by the test, not by timing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

from provider.emulator import Emulator
from provider.emulator.settings import Settings

from .helpers import api, create_sandbox, sh

pytestmark = pytest.mark.anyio

WAIT_GATE = "until [ -e /tmp/go ]; do sleep 0.02; done"
Box = tuple[httpx.AsyncClient, str]


class Frames:
    """The frames of one streamed exec, read one at a time."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self._lines = lines
        self.seen: list[dict[str, Any]] = []

    async def next(self) -> dict[str, Any]:
        async for line in self._lines:
            if line:
                frame: dict[str, Any] = json.loads(line)
                self.seen.append(frame)
                return frame
        raise AssertionError(f"the stream ended after {self.seen}")

    async def until_stdout(self, text: str) -> None:
        """Read until the stdout so far ends with ``text`` (chunks may merge lines)."""
        while not self.stdout().endswith(text):
            await self.next()

    def stdout(self) -> str:
        return "".join(frame.get("stdout", "") for frame in self.seen)

    async def to_end(self) -> list[dict[str, Any]]:
        async for line in self._lines:
            if line:
                self.seen.append(json.loads(line))
        return self.seen

    def output(self) -> list[dict[str, Any]]:
        """The frames other than heartbeats."""
        return [frame for frame in self.seen if frame != {"hb": True}]


@asynccontextmanager
async def streamed(
    client: httpx.AsyncClient, sandbox_id: str, script: str
) -> AsyncIterator[Frames]:
    body = {"cmd": "/bin/bash", "args": ["-c", script]}
    url = f"/v1/sandboxes/{sandbox_id}/exec"
    with anyio.fail_after(20):
        async with client.stream("POST", url, params={"stream": "true"}, json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/x-ndjson"
            yield Frames(response.aiter_lines())


@pytest.fixture
async def box(emulator: Emulator) -> AsyncIterator[Box]:
    """A client and one sandbox of its key."""
    async with api(emulator) as client:
        yield client, await create_sandbox(client)


async def open_gate(client: httpx.AsyncClient, sandbox_id: str) -> None:
    answer = await client.put(f"/v1/sandboxes/{sandbox_id}/files?path=/tmp/go", content=b"")
    assert answer.status_code == 200


async def test_frames_leave_while_the_command_runs(box: Box) -> None:
    # The second line is printed only once the gate opens, and the gate opens only once the
    # first frame has arrived: a buffered stream would wait here until fail_after.
    client, sandbox_id = box
    script = f"echo first; {WAIT_GATE}; echo second >&2; exit 5"
    async with streamed(client, sandbox_id, script) as frames:
        assert await frames.next() == {"stdout": "first\n"}
        await open_gate(client, sandbox_id)
        await frames.to_end()
    assert frames.output() == [{"stdout": "first\n"}, {"stderr": "second\n"}, {"exit_code": 5}]


async def test_a_silence_gets_heartbeats(emulator: Emulator, box: Box) -> None:
    await emulator.admin.settings(heartbeat_ms=100)
    client, sandbox_id = box
    async with streamed(client, sandbox_id, f"echo start; {WAIT_GATE}") as frames:
        assert await frames.next() == {"stdout": "start\n"}
        assert await frames.next() == {"hb": True}  # while the command says nothing
        await open_gate(client, sandbox_id)
        await frames.to_end()
    assert frames.output() == [{"stdout": "start\n"}, {"exit_code": 0}]


def test_heartbeats_default_to_every_5_seconds() -> None:
    assert Settings().heartbeat_ms == 5000


@pytest.mark.slow
async def test_a_silence_of_over_5_seconds_gets_a_heartbeat_by_default(box: Box) -> None:
    client, sandbox_id = box
    async with streamed(client, sandbox_id, WAIT_GATE) as frames:
        assert await frames.next() == {"hb": True}
        await open_gate(client, sandbox_id)
        assert await frames.to_end() == [{"hb": True}, {"exit_code": 0}]


async def test_the_stream_ends_at_stdio_eof_not_at_the_leaders_exit(
    emulator: Emulator, box: Box
) -> None:
    # The leader exits at once (code 3); a background child keeps its stdout, waits until the
    # leader is gone, says so, then waits for the gate. With no drain window after the leader's
    # exit, a stream that ended at that exit could never carry the child's lines.
    await emulator.admin.settings(exit_drain_ms=0)
    child = (
        "leader=$$; ( while kill -0 $leader 2>/dev/null; do sleep 0.02; done; "
        f"echo leader-gone; {WAIT_GATE}; echo child-done ) &"
    )
    client, sandbox_id = box
    async with streamed(client, sandbox_id, f"{child} echo leader-done; exit 3") as frames:
        await frames.until_stdout("leader-gone\n")
        await open_gate(client, sandbox_id)
        await frames.to_end()
    assert frames.stdout() == "leader-done\nleader-gone\nchild-done\n"
    assert frames.seen[-1] == {"exit_code": 3}  # the leader's code, after all the output


async def test_a_client_hanging_up_does_not_kill_the_command(box: Box) -> None:
    client, sandbox_id = box
    script = f"echo started; {WAIT_GATE}; echo survived > /tmp/survived"
    async with streamed(client, sandbox_id, script) as frames:
        assert await frames.next() == {"stdout": "started\n"}
    # The connection is closed: the command still runs, sees the gate and writes its file.
    wait = "timeout 10 bash -c 'until [ -e /tmp/survived ]; do sleep 0.02; done'"
    result = await sh(client, sandbox_id, f"touch /tmp/go && {wait} && cat /tmp/survived")
    assert result["stdout"] == "survived\n"


async def test_after_a_hang_up_later_output_is_drained_not_blocking_nor_killing(box: Box) -> None:
    # After the client is gone the command writes 8 MiB to each of stdout and stderr (far
    # more than the pipes hold): a writer left blocking would never write its file, a closed
    # pipe would kill it by SIGPIPE before it does.
    client, sandbox_id = box
    flood = "head -c 8M /dev/zero | tr '\\0' x"
    script = (
        f"set -o pipefail; echo started; {WAIT_GATE}; {flood} && {flood} >&2 && touch /tmp/done"
    )
    async with streamed(client, sandbox_id, script) as frames:
        assert await frames.next() == {"stdout": "started\n"}
    wait = "timeout 10 bash -c 'until [ -e /tmp/done ]; do sleep 0.02; done'"
    result = await sh(client, sandbox_id, f"touch /tmp/go && {wait}")
    assert result["exit_code"] == 0
