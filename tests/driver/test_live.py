"""The live relay: ordered execute.log chunks from their own task, a bounded queue, and a result
answered only after every chunk went out."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from provider.driver.commands.live import LiveRelay
from provider.driver.commands.output import LIVE_CHUNK_MAX, LiveBudget
from provider.driver.core.runtime import DriverRuntime
from provider.driver.service import DriverService
from tests.driver.conftest import Harness, unpaced_client

pytestmark = pytest.mark.anyio

Sent = list[tuple[str, dict[str, Any]]]


async def test_chunks_go_out_in_order_and_run_ends_after_close() -> None:
    sent: Sent = []

    async def notify(method: str, params: dict[str, Any]) -> None:
        sent.append((method, params))

    relay = LiveRelay(notify)
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        for index in range(50):
            await relay.put("stdout" if index % 3 else "stderr", f"line {index}\n")
        relay.close()
    # Everything was queued before the writer ran: each run of one stream went out as one
    # notification, in the order of arrival.
    streams = ["stdout" if i % 3 else "stderr" for i in range(50)]
    runs: list[tuple[str, str]] = []
    for index, stream in enumerate(streams):
        if runs and runs[-1][0] == stream:
            runs[-1] = (stream, runs[-1][1] + f"line {index}\n")
        else:
            runs.append((stream, f"line {index}\n"))
    assert {m for m, _ in sent} == {"execute.log"}
    assert [(p["stream"], p["chunk"]) for _, p in sent] == runs
    assert relay.queued_chars == 0


async def test_a_full_queue_holds_the_reader_until_the_writer_catches_up() -> None:
    release = anyio.Event()
    sent: list[str] = []

    async def stuck_host(method: str, params: dict[str, Any]) -> None:
        await release.wait()
        sent.append(params["chunk"])

    relay = LiveRelay(stuck_host, max_chars=10)
    queued: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)

        async def reader() -> None:
            for index in range(5):
                await relay.put("stdout", f"{index}" * 4)
                queued.append(index)

        tg.start_soon(reader)
        await anyio.wait_all_tasks_blocked()
        # The writer holds "00001111" (still counted); "2222" does not fit beside it.
        assert queued == [0, 1]
        assert relay.queued_chars == 8
        release.set()
        await anyio.wait_all_tasks_blocked()
        relay.close()
    # What piled up while the host was stuck went out merged; nothing was lost or reordered.
    assert sent[0] == "00001111"
    assert "".join(sent) == "00001111222233334444"


async def test_the_budget_and_chunk_limit_apply() -> None:
    sent: list[str] = []

    async def notify(method: str, params: dict[str, Any]) -> None:
        sent.append(params["chunk"])

    relay = LiveRelay(notify, budget=LiveBudget(LIVE_CHUNK_MAX + 10))
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await relay.put("stdout", "a" * (LIVE_CHUNK_MAX + 5))
        await relay.put("stdout", "b" * 20)
        relay.close()
    # The bound cuts the first put; its rest and the admitted part of the second are merged.
    assert [len(chunk) for chunk in sent] == [LIVE_CHUNK_MAX, 10]
    assert sent[-1] == "aaaaabbbbb"


async def test_a_lone_piece_is_sent_at_once_and_a_slow_host_gets_merged_chunks() -> None:
    sent: list[tuple[str, str]] = []
    writing = anyio.Event()
    release = anyio.Event()

    async def slow_host(method: str, params: dict[str, Any]) -> None:
        writing.set()
        await release.wait()
        sent.append((params["stream"], params["chunk"]))

    relay = LiveRelay(slow_host)
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await relay.put("stdout", "first\n")
        with anyio.fail_after(5):
            await writing.wait()  # no timer: the lone piece went out at once
        for index in range(5):  # arrive while the host is still reading "first"
            await relay.put("stdout", f"o{index}\n")
        await relay.put("stderr", "e\n")
        await relay.put("stdout", "last\n")
        release.set()
        relay.close()
    assert sent == [
        ("stdout", "first\n"),
        ("stdout", "o0\no1\no2\no3\no4\n"),
        ("stderr", "e\n"),
        ("stdout", "last\n"),
    ]


async def test_execute_answers_only_after_a_slow_host_took_every_chunk(harness: Harness) -> None:
    lease = await harness.acquire()
    delivered: list[str] = []

    async def slow_host(method: str, params: dict[str, Any]) -> None:
        await anyio.sleep(0.2)
        delivered.append(params["chunk"])

    async def log(level: str, message: str, meta: dict[str, Any] | None = None) -> None:
        return None

    runtime = DriverRuntime(client_factory=unpaced_client, environ={})
    service = DriverService(runtime, notify=slow_host, log=log)
    script = "for i in 1 2 3 4 5; do echo $i; sleep 0.05; done"
    result = await service.execute(
        {**harness.with_lease(lease), "command": "bash", "args": ["-c", script]}
    )
    assert result["stdout"] == "1\n2\n3\n4\n5\n"
    assert "".join(delivered) == result["stdout"]
