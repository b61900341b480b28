"""Duplex channels against the emulator: real processes, real streams, scripted faults
(docs/protocol.md 7, checklist 75-79)."""

from __future__ import annotations

import base64
import os
from typing import Any

import anyio
import pytest

from provider.errors import InvalidParams, OperationCancelled, ProviderError, RequestRefused
from provider.replies import AfterReply
from tests.driver.conftest import Harness
from tests.driver.session_helpers import (
    answered,
    channel_bytes,
    names,
    notes,
    open_channel,
    open_params,
    until,
    write,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio
ROUTE = "duplex-route-1"


async def inputs(h: Harness) -> list[dict[str, Any]]:
    return [r for r in await h.emulator.admin.requests() if r["path"].endswith("/input")]


async def test_cat_echoes_bytes_exactly_and_stderr_only_reaches_the_log(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    session = await open_channel(h, lease, ["bash", "-c", "echo to-stderr >&2; exec cat"])
    await write(h, ROUTE, session, b"\x00\xff\x80")
    await until(lambda: channel_bytes(h, ROUTE) == b"\x00\xff\x80")
    payload = os.urandom(600 * 1024)
    await write(h, ROUTE, session, payload)
    await until(lambda: channel_bytes(h, ROUTE) == b"\x00\xff\x80" + payload)
    for chunk in notes(h, "duplexChannel.data", ROUTE):
        assert chunk["workerSessionId"] == session
        assert 1 <= len(base64.b64decode(chunk["chunk"])) <= 196_608
    await until(lambda: any("to-stderr" in message for _, message in h.logs))
    assert all(level == "warn" for level, m in h.logs if "to-stderr" in m)
    assert b"to-stderr" not in channel_bytes(h, ROUTE)
    answer = await h.methods.channel_close({"hostRouteId": ROUTE})
    assert answer == {"hostRouteId": ROUTE, "workerSessionId": session}


async def test_writes_are_split_at_256_kib_in_order_and_bad_base64_is_refused(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    session = await open_channel(h, lease, ["cat"])
    before = len(await inputs(h))
    host_max = os.urandom(262_144)
    await write(h, ROUTE, session, host_max)
    assert len(await inputs(h)) == before + 1
    big = os.urandom(600 * 1024)
    await write(h, ROUTE, session, big)
    assert len(await inputs(h)) == before + 4
    with pytest.raises(InvalidParams, match="base64"):
        await h.methods.channel_write(
            {"hostRouteId": ROUTE, "workerSessionId": session, "data": "abc"}
        )
    with pytest.raises(InvalidParams, match="base64"):
        await h.methods.channel_write(
            {"hostRouteId": ROUTE, "workerSessionId": session, "data": "YWJj\n"}
        )
    await h.methods.channel_write({"hostRouteId": ROUTE, "workerSessionId": session, "data": ""})
    await write(h, ROUTE, session, b"after")
    await until(lambda: channel_bytes(h, ROUTE) == host_max + big + b"after")
    with pytest.raises(RequestRefused):
        await write(h, ROUTE, "duplex-someone-else", b"x")
    with pytest.raises(RequestRefused):
        await write(h, "duplex-route-9", session, b"x")
    await h.methods.channel_close({"hostRouteId": ROUTE})


async def test_exit_follows_the_last_data_chunk_with_the_exit_code(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    await open_channel(h, lease, ["bash", "-c", "printf hello; printf ' world'; exit 3"])
    await until(lambda: bool(notes(h, "duplexChannel.exit", ROUTE)))
    ours = [(m, p) for m, p in h.notifications if p.get("hostRouteId") == ROUTE]
    assert ours[-1][0] == "duplexChannel.exit"
    assert [m for m, _ in ours].count("duplexChannel.exit") == 1
    assert ours[-1][1]["exitCode"] == 3 and "transportClosed" not in ours[-1][1]
    assert channel_bytes(h, ROUTE) == b"hello world"


async def test_a_stream_that_cannot_be_followed_reports_transport_closed_and_kills(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    await h.emulator.admin.add_fault("GET", r"/connect$", cut_after_frames=1)
    await h.emulator.admin.add_fault("GET", r"/connect$", status=503, times=10)
    await open_channel(h, lease, ["bash", "-c", "printf x; exec sleep 1000"])
    await until(lambda: bool(notes(h, "duplexChannel.exit", ROUTE)))
    (exit_note,) = notes(h, "duplexChannel.exit", ROUTE)
    assert exit_note["exitCode"] is None and exit_note["transportClosed"] is True
    await h.emulator.admin.clear_faults()
    deletes = [
        r
        for r in await h.emulator.admin.requests()
        if r["method"] == "DELETE" and "/processes/" in r["path"]
    ]
    assert len(deletes) == 1 and "grace_ms=1000" in deletes[0]["query"]
    assert await h.emulator.admin.live_process_count() == 0


async def test_close_closes_stdin_stops_the_child_and_answers_the_pair(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    session = await open_channel(h, lease, ["bash", "-c", "trap '' TERM; cat; sleep 1000"])
    answer = await h.methods.channel_close({"hostRouteId": ROUTE})
    assert answer == {"hostRouteId": ROUTE, "workerSessionId": session}
    paths = [r["path"] for r in await h.emulator.admin.requests()]
    assert any(p.endswith("/stdin/close") for p in paths)
    (exit_note,) = notes(h, "duplexChannel.exit", ROUTE)
    assert exit_note["exitCode"] is None
    assert await h.emulator.admin.live_process_count() == 0
    # again, and for a route whose child exited on its own, and one never bound
    assert await h.methods.channel_close({"hostRouteId": ROUTE}) == answer
    other = await open_channel(h, lease, ["true"], route="duplex-route-2")
    await until(lambda: bool(notes(h, "duplexChannel.exit", "duplex-route-2")))
    count = await h.request_count()
    assert await h.methods.channel_close({"hostRouteId": "duplex-route-2"}) == {
        "hostRouteId": "duplex-route-2",
        "workerSessionId": other,
    }
    assert await h.request_count() == count  # nothing left to close or kill
    assert await h.methods.channel_close({"hostRouteId": "duplex-route-77"}) == {
        "hostRouteId": "duplex-route-77"
    }


async def test_stop_is_one_confirmed_delete_that_terms_first_and_later_stops_do_nothing(
    harness: Harness,
) -> None:
    """The DELETE's own SIGTERM (before its SIGKILL grace) is what lets the child end cleanly:
    its TERM trap runs; no separate /signal request goes first."""
    h = harness
    lease = await h.acquire()
    trap = "trap 'touch /paperclip-workspace/termed; exit 0' TERM; while :; do sleep 0.1; done"
    session = await open_channel(h, lease, ["bash", "-c", trap])
    pair = {"hostRouteId": ROUTE, "workerSessionId": session}
    before = await h.request_count()
    await h.methods.channel_stop(pair)
    stop_calls = [
        (r["method"], r["path"].rsplit("/", 1)[-1], r["query"])
        for r in (await h.emulator.admin.requests())[before:]
    ]
    assert len(stop_calls) == 1
    assert stop_calls[0][0] == "DELETE" and "grace_ms=1000" in stop_calls[0][2]
    termed = await h.methods.execute(
        {**h.with_lease(lease), "command": "test", "args": ["-e", "/paperclip-workspace/termed"]}
    )
    assert termed["exitCode"] == 0
    (exit_note,) = notes(h, "duplexChannel.exit", ROUTE)
    assert exit_note["exitCode"] is None
    count = await h.request_count()
    await h.methods.channel_stop(pair)
    for _ in range(50):  # a flood of writes after the stop: each refused, nothing sent
        with pytest.raises(RequestRefused):
            await write(h, ROUTE, session, b"late")
    assert await h.request_count() == count


async def test_nothing_is_sent_for_a_channel_before_its_open_is_answered(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    reply = await h.methods.channel_open(
        open_params(h, lease, ROUTE, command=["bash", "-c", "printf early; exit 4"])
    )
    await anyio.sleep(1.0)  # the test: the process has long exited, yet nothing precedes the answer
    assert not [p for _, p in h.notifications if p.get("hostRouteId") == ROUTE]
    await answered(reply)
    await until(lambda: bool(notes(h, "duplexChannel.exit", ROUTE)))
    assert channel_bytes(h, ROUTE) == b"early"
    assert notes(h, "duplexChannel.exit", ROUTE)[0]["exitCode"] == 4


async def test_an_open_whose_answer_was_not_sent_is_stopped_and_never_announced(
    harness: Harness,
) -> None:
    """The dispatcher could not write the open's result (an error went instead): the host never
    bound the pair, so the channel is stopped, nothing names it, and a close answers the route
    alone (a pair the host does not know would make it kill the worker)."""
    h = harness
    lease = await h.acquire()
    reply = await h.methods.channel_open(
        open_params(h, lease, ROUTE, command=["bash", "-c", "printf early; exec cat"])
    )
    assert isinstance(reply, AfterReply)
    assert await h.emulator.admin.live_process_count() == 1
    reply.written(False)
    await until(lambda: not any(True for _ in h.methods.interactive.table))
    assert await h.emulator.admin.live_process_count() == 0
    assert await h.methods.channel_close({"hostRouteId": ROUTE}) == {"hostRouteId": ROUTE}
    await anyio.sleep(0.3)  # the test: time passes and nothing names the route
    assert not [p for _, p in h.notifications if p.get("hostRouteId") == ROUTE]


async def test_release_closes_the_channel_before_deleting_the_sandbox(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    await open_channel(h, lease, ["cat"])
    assert await h.methods.release(h.lease_ref(lease)) == {
        "providerLeaseId": lease["providerLeaseId"],
        "state": "destroyed",
    }
    (exit_note,) = notes(h, "duplexChannel.exit", ROUTE)
    assert exit_note["exitCode"] is None
    methods = [(r["method"], r["path"]) for r in await h.emulator.admin.requests()]
    kill = max(i for i, (m, p) in enumerate(methods) if m == "DELETE" and "/processes/" in p)
    delete = max(i for i, (m, p) in enumerate(methods) if m == "DELETE" and "/processes" not in p)
    assert kill < delete
    with pytest.raises(RequestRefused, match="no such lease"):
        await h.methods.channel_open(open_params(h, lease, "duplex-route-2", command=["cat"]))


async def test_an_unconfirmed_stop_refuses_a_reuse_release_and_destroy_still_deletes(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire(reuseLease=True)
    await open_channel(h, lease, ["sleep", "1000"])
    await h.emulator.admin.add_fault("DELETE", r"/processes/[^/]+$", status=503, times=20)
    with pytest.raises(RequestRefused, match=r"(?i)destroy"):
        await h.methods.release(h.lease_ref(lease, reuseLease=True))
    sandbox = lease["providerLeaseId"]
    state = await h.emulator.admin.state()
    (view,) = [s for s in state["sandboxes"] if s["id"] == sandbox]
    assert view["status"] == "running"  # neither paused nor left warm as reusable
    await h.emulator.admin.clear_faults()
    assert await h.methods.destroy(h.lease_ref(lease, reuseLease=True)) == {
        "providerLeaseId": lease["providerLeaseId"],
        "state": "destroyed",
    }
    assert await h.emulator.admin.live_process_count() == 0


async def test_a_close_racing_the_open_cancels_it_and_leaves_nothing(harness: Harness) -> None:
    h = harness
    lease = await h.acquire()
    await h.emulator.admin.add_fault("GET", r"/connect$", delay_ms=1500)
    failures: list[BaseException] = []

    async def opener() -> None:
        try:
            await h.methods.channel_open(open_params(h, lease, ROUTE, command=["cat"]))
        except ProviderError as exc:
            failures.append(exc)

    async def started() -> bool:
        return await h.emulator.admin.live_process_count() == 1

    async with anyio.create_task_group() as group:
        group.start_soon(opener)
        await until(lambda: any(True for _ in h.methods.interactive.table))
        await wait_until(started)  # the process runs; its output's connect is held
        assert await h.methods.channel_close({"hostRouteId": ROUTE}) == {"hostRouteId": ROUTE}
    assert len(failures) == 1 and isinstance(failures[0], OperationCancelled)
    assert await h.emulator.admin.live_process_count() == 0
    assert not [p for _, p in h.notifications if p.get("hostRouteId") == ROUTE]
    assert "duplexChannel.exit" not in names(h)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ([], "non-empty"),
        (["cat", ""], r"command\[1\] is empty"),
        (["cat", "a\0b"], "NUL"),
        (["x"] * 1001, "at most 1000"),
        # Under the old 1 MiB total, yet past the one bash argument it travels in (128 KiB).
        (["x" * 131_050], r"at most 131,071 .* command\[0\] \(131,050 bytes\)"),
    ],
)
async def test_bad_commands_are_refused_before_any_request(
    harness: Harness, command: list[str], message: str
) -> None:
    h = harness
    lease = await h.acquire()
    count = await h.request_count()
    with pytest.raises(InvalidParams, match=message):
        await h.methods.channel_open(open_params(h, lease, ROUTE, command=command))
    assert await h.request_count() == count


async def test_opens_on_unknown_leases_bad_drivers_and_busy_routes_are_refused(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    await open_channel(h, lease, ["cat"])
    count = await h.request_count()
    cases = [
        (open_params(h, lease, ROUTE, command=["cat"]), "already open"),
        (open_params(h, lease, "", command=["cat"]), "hostRouteId"),
        (open_params(h, lease, "r" * 201, command=["cat"]), "hostRouteId"),
        (open_params(h, lease, "duplex-route-2", command=["cat"], driverKey="e2b"), "createos"),
        (
            {**open_params(h, lease, "duplex-route-2", command=["cat"]), "companyId": "other"},
            "no such lease",
        ),
        (
            {**open_params(h, lease, "duplex-route-2", command=["cat"]), "providerLeaseId": "sb-x"},
            "no such lease",
        ),
    ]
    for params, message in cases:
        with pytest.raises(RequestRefused, match=message):
            await h.methods.channel_open(params)
    with pytest.raises(InvalidParams):
        await h.methods.channel_open({**open_params(h, lease, "r2"), "command": "cat"})
    assert await h.request_count() == count
    await h.methods.channel_close({"hostRouteId": ROUTE})


async def test_oversized_writes_are_refused_and_100_malformed_ones_stop_the_channel(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    session = await open_channel(h, lease, ["cat"])
    with pytest.raises(InvalidParams, match="8 MiB"):
        await write(h, ROUTE, session, b"x" * (8 * 1024 * 1024 + 1))
    await write(h, ROUTE, session, b"still up")
    await until(lambda: channel_bytes(h, ROUTE) == b"still up")
    for _ in range(99):
        with pytest.raises(InvalidParams, match="base64"):
            await h.methods.channel_write(
                {"hostRouteId": ROUTE, "workerSessionId": session, "data": "%%%%"}
            )
    assert not notes(h, "duplexChannel.exit", ROUTE)
    with pytest.raises(InvalidParams, match="stopped"):
        await h.methods.channel_write(
            {"hostRouteId": ROUTE, "workerSessionId": session, "data": "%%%%"}
        )
    assert notes(h, "duplexChannel.exit", ROUTE)[0]["exitCode"] is None
    with pytest.raises(RequestRefused):
        await write(h, ROUTE, session, b"x")
    assert await h.emulator.admin.live_process_count() == 0


async def test_a_worker_that_never_saw_the_lease_refuses_to_open_on_it(harness: Harness) -> None:
    """2.12: the registry is in memory; a restarted worker has not seen the lease."""
    from provider.driver.service import DriverService

    h = harness
    lease = await h.acquire()

    async def ignore(*args: Any) -> None:
        return None

    fresh = DriverService(h.methods.runtime, notify=ignore, log=ignore)
    count = await h.request_count()
    with pytest.raises(RequestRefused, match="restarted"):
        await fresh.channel_open(open_params(h, lease, ROUTE, command=["cat"]))
    assert await h.request_count() == count
    await fresh.execute({**h.with_lease(lease), "command": "true"})  # an owned call registers
    await answered(await fresh.channel_open(open_params(h, lease, ROUTE, command=["cat"])))
    await fresh.channel_close({"hostRouteId": ROUTE})


async def test_writes_queued_behind_an_input_in_flight_go_out_together_in_order(
    harness: Harness,
) -> None:
    """The host writes an HTTP/2 response as several small writes at once; each /input costs a
    pacing token, so writes that wait behind one in flight share the next one."""
    h = harness
    lease = await h.acquire()
    session = await open_channel(h, lease, ["cat"])
    before = len(await inputs(h))
    await h.emulator.admin.add_fault("POST", r"/input$", delay_ms=600)
    pieces = [f"piece-{n};".encode() for n in range(6)]
    async with anyio.create_task_group() as group:
        for piece in pieces:
            group.start_soon(write, h, ROUTE, session, piece)
            await anyio.sleep(0.05)  # each write arrives while the first is still in flight
    await until(lambda: channel_bytes(h, ROUTE) == b"".join(pieces))
    assert len(await inputs(h)) - before == 2
    await h.methods.channel_close({"hostRouteId": ROUTE})


async def test_a_failed_input_fails_every_write_it_carried_and_ends_the_channel(
    harness: Harness,
) -> None:
    h = harness
    lease = await h.acquire()
    session = await open_channel(h, lease, ["cat"])
    await h.emulator.admin.add_fault("POST", r"/input$", status=400, times=5)
    failures: list[BaseException] = []

    async def failing_write(piece: bytes) -> None:
        try:
            await write(h, ROUTE, session, piece)
        except ProviderError as exc:
            failures.append(exc)

    async with anyio.create_task_group() as group:
        for n in range(3):
            group.start_soon(failing_write, b"x%d" % n)
            await anyio.sleep(0.01)
    assert len(failures) == 3
    await until(lambda: bool(notes(h, "duplexChannel.exit", ROUTE)))
    assert notes(h, "duplexChannel.exit", ROUTE)[0]["exitCode"] is None
    with pytest.raises(RequestRefused):
        await write(h, ROUTE, session, b"later")
    assert await h.emulator.admin.live_process_count() == 0
